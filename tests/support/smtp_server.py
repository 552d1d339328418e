"""The SMTP server of tests/smtp.rs: aiosmtpd on 127.0.0.1, a free port, with a handler whose
behaviour each message chooses by the local part of its first recipient:

  ok@...            250: taken
  greylist@...      451 4.7.1 to the final "." the first time a Message-ID comes, then 250
  closing@...       421 4.3.2 to the final "." the first time a Message-ID comes, then 250
  unknown@...       550 5.1.1 to RCPT TO: refused before DATA
  content@...       554 5.6.0 to the final ".": refused after the body, nothing taken
  drop-rcpt@...     the connection is dropped at RCPT TO, before DATA
  drop-data@...     the message is taken, then the connection is dropped before the reply

Every message taken is appended to the journal (the second argument) as one JSON line, and
flushed before the server answers, so a test that reads it after the client's answer sees it.
Prints "port <n>" once listening.
"""

import asyncio
import json
import sys
from email import message_from_bytes

from aiosmtpd.smtp import SMTP

journal_path = sys.argv[1]
seen = {}


def take(envelope, message_id):
    with open(journal_path, "a", encoding="utf-8") as journal:
        journal.write(
            json.dumps(
                {
                    "mail_from": envelope.mail_from,
                    "rcpt_tos": envelope.rcpt_tos,
                    "message_id": message_id,
                    "size": len(envelope.original_content or b""),
                }
            )
            + "\n"
        )
        journal.flush()


def first_time(message_id):
    seen[message_id] = seen.get(message_id, 0) + 1
    return seen[message_id] == 1


class Handler:
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@", 1)[0]
        if local == "unknown":
            return "550 5.1.1 <%s>: Recipient address rejected: User unknown" % address
        if local == "drop-rcpt":
            server.transport.abort()
            return "250 OK"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        parsed = message_from_bytes(envelope.original_content or b"")
        message_id = (parsed.get("Message-ID") or "").strip()
        behaviour = envelope.rcpt_tos[0].split("@", 1)[0]
        if behaviour == "greylist" and first_time(message_id):
            return "451 4.7.1 Greylisted, try again later"
        if behaviour == "closing" and first_time(message_id):
            return "421 4.3.2 Service shutting down"
        if behaviour == "content":
            return "554 5.6.0 Message content rejected"
        take(envelope, message_id)
        if behaviour == "drop-data":
            server.transport.abort()
        return "250 2.0.0 Ok: queued"


async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SMTP(Handler(), hostname="fake.test", decode_data=False),
        host="127.0.0.1",
        port=0,
    )
    port = server.sockets[0].getsockname()[1]
    print("port %d" % port, flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
