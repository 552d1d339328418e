//! The syntax checks of a message's text fields: RFC 5322 mailboxes and field names, E.164
//! numbers, and the line breaks no header may carry.
//!
//! A header injection (`"X-A\r\nBcc: victim@example.com"`) works by smuggling a line break into
//! a field the provider copies into the email's header; refusing CR and LF in every field that
//! ends up there, and checking addresses and field names against their grammar, closes it at
//! build time, before any codec sees the message.

/// Whether `text` holds a carriage return or a line feed.
pub(crate) fn has_line_break(text: &str) -> bool {
    text.bytes().any(|b| b == b'\r' || b == b'\n')
}

/// RFC 5322 §3.6.8 `field-name = 1*ftext`, `ftext` being printable US-ASCII except `:`.
pub(crate) fn is_field_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (33..=126).contains(&b) && b != b':')
}

/// RFC 5322 `atext`, extended by RFC 6532 with every non-ASCII character (internationalized
/// addresses and display names).
fn is_atext(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c) || !c.is_ascii()
}

/// RFC 5322 `dot-atom-text`: atoms joined by single dots.
fn is_dot_atom(text: &str) -> bool {
    !text.is_empty()
        && text
            .split('.')
            .all(|atom| !atom.is_empty() && atom.chars().all(is_atext))
}

/// RFC 5322 `quoted-string` without folding whitespace: `"` … `"`, with `\` escaping one
/// printable character or space.
fn is_quoted_string(text: &str) -> bool {
    let Some(inner) = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return false;
    };
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped) if escaped == ' ' || escaped == '\t' || is_vchar(escaped) => {}
                _ => return false,
            },
            '"' => return false,
            c if c == ' ' || c == '\t' || is_vchar(c) => {}
            _ => return false,
        }
    }
    true
}

/// A visible character: printable ASCII or any non-ASCII character (RFC 6532).
fn is_vchar(c: char) -> bool {
    ('!'..='~').contains(&c) || (!c.is_ascii() && !c.is_control())
}

/// RFC 5322 §3.4.1 `addr-spec = local-part "@" domain`, without comments or folding
/// whitespace: `local-part` a dot-atom or a quoted string, `domain` a dot-atom or a
/// `[domain-literal]`.
pub(crate) fn is_addr_spec(address: &str) -> bool {
    let Some(at) = address.rfind('@') else {
        return false;
    };
    let (local, domain) = (&address[..at], &address[at + 1..]);
    let local_ok = is_dot_atom(local) || is_quoted_string(local);
    let domain_ok = is_dot_atom(domain)
        || domain
            .strip_prefix('[')
            .and_then(|d| d.strip_suffix(']'))
            .is_some_and(|d| {
                d.bytes()
                    .all(|b| matches!(b, 33..=90 | 94..=126) && b != b'[' && b != b']')
            });
    local_ok && domain_ok
}

/// RFC 5322 §3.4 `mailbox = name-addr / addr-spec`: a bare address, or an address in angle
/// brackets after an optional display name (`Ann Lee <ann@example.com>`,
/// `"Lee, Ann" <ann@example.com>`). An unquoted display name is words of `atext` and dots
/// (RFC 5322's obsolete phrase); one holding other specials (`,`, `;`, `@`, …) must be quoted.
pub(crate) fn is_mailbox(mailbox: &str) -> bool {
    let Some(inner) = mailbox.strip_suffix('>') else {
        return is_addr_spec(mailbox);
    };
    let Some(open) = inner.rfind('<') else {
        return false;
    };
    let (name, address) = (
        inner[..open].trim_end_matches([' ', '\t']),
        &inner[open + 1..],
    );
    is_addr_spec(address) && (name.is_empty() || is_display_name(name))
}

fn is_display_name(name: &str) -> bool {
    if name.starts_with('"') {
        return is_quoted_string(name);
    }
    name.split([' ', '\t'])
        .filter(|word| !word.is_empty())
        .all(|word| word.chars().all(|c| is_atext(c) || c == '.'))
}

/// ITU-T E.164 as providers write it: `+`, then 1 to 15 digits, the first not `0`.
pub(crate) fn is_e164(number: &str) -> bool {
    number.strip_prefix('+').is_some_and(|digits| {
        (1..=15).contains(&digits.len())
            && digits.bytes().all(|b| b.is_ascii_digit())
            && !digits.starts_with('0')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailboxes_follow_rfc_5322() {
        for good in [
            "a@example.com",
            "first.last+tag@sub.example.co",
            "Ann Lee <ann@example.com>",
            "<ann@example.com>",
            "\"Lee, Ann\" <ann@example.com>",
            "\"quoted local\"@example.com",
            "user@[192.0.2.1]",
            "Jürgen <jürgen@bücher.example>",
            "A. N. Other <a@b>",
        ] {
            assert!(is_mailbox(good), "{good}");
        }
        for bad in [
            "",
            "a@b@c",
            "plain",
            "@example.com",
            "a@",
            "a..b@example.com",
            ".a@example.com",
            "a@example..com",
            "Lee, Ann <ann@example.com>",
            "Ann <ann@example.com",
            "Ann <a@b@c>",
            "a b@example.com",
            "\"unterminated@example.com",
            "a@exa mple.com",
        ] {
            assert!(!is_mailbox(bad), "{bad}");
        }
    }

    #[test]
    fn field_names_are_printable_ascii_without_a_colon() {
        assert!(is_field_name("X-Order-Id"));
        for bad in ["", "X-A\r\nBcc", "X A", "X:A", "Ünï"] {
            assert!(!is_field_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn e164_numbers_are_a_plus_and_up_to_15_digits() {
        assert!(is_e164("+14155552345"));
        assert!(is_e164("+442071838750"));
        for bad in [
            "14155552345",
            "+",
            "+0123",
            "+1415555234567890",
            "+1 415",
            "+1-415",
        ] {
            assert!(!is_e164(bad), "{bad}");
        }
    }
}
