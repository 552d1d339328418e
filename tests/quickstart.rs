//! The quickstart, run twice on one file as a user would: the second run sends nothing.

mod support;

// The example itself, so this test runs exactly what a user runs; its `main` is unused here.
#[allow(dead_code)]
#[path = "../examples/quickstart/src/main.rs"]
mod quickstart;

use support::stores::SqliteDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_run_twice_calls_the_provider_only_in_the_first_run() {
    let dir = SqliteDir::new("quickstart");
    let path = dir.file();
    assert_eq!(quickstart::run(&path).await.unwrap(), 2, "first run");
    // Its store is dropped with the run; the second run opens the file afresh.
    assert_eq!(
        quickstart::run(&path).await.unwrap(),
        0,
        "second run: answered from the store, nothing sent again"
    );
}
