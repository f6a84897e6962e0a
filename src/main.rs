//! The `ultr` binary: its command line (`cli`) parses arguments and calls the library; the
//! experiment commands wire in `ultr-lab`, which the library does not use.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
