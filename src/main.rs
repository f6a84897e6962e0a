//! The `ultr` binary: argument parsing lives in `ultr::cli`; this only reports errors.

fn main() -> std::process::ExitCode {
    ultr::cli::main()
}
