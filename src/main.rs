//! The `ultr` binary: its command line (`cli`) parses arguments and calls the library;
//! `ultr experiment` runs the laboratory's own binary, `ultr-lab`, which neither links.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
