//! The name filter criterion was given, for the interleaved modes, which run outside
//! criterion and would otherwise run every backend whatever the command line asked for.

/// Whether criterion's filter (the first argument that is not an option) selects `name`.
/// Understands the filters the documented commands use: `^prefix` matches names that start
/// with `prefix`, anything else names that contain it; no filter selects every name.
pub(crate) fn selected(name: &str) -> bool {
    // criterion's options that take a value: their value is not the filter.
    const VALUED: [&str; 16] = [
        "-s",
        "--save-baseline",
        "-b",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "-c",
        "--color",
        "--output-format",
        "--profile-time",
        "--measurement-time",
        "--warm-up-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
    ];
    let mut args = std::env::args().skip(1);
    let mut filter = None;
    while let Some(arg) = args.next() {
        if VALUED.contains(&arg.as_str()) || arg == "--sample-size" || arg == "--plotting-backend" {
            args.next();
        } else if !arg.starts_with('-') {
            filter = Some(arg);
            break;
        }
    }
    match filter {
        None => true,
        Some(filter) => match filter.strip_prefix('^') {
            Some(prefix) => name.starts_with(prefix),
            None => name.contains(filter.as_str()),
        },
    }
}
