//! The `handoff` binary: everything is in the library's [`handoff::cli`].

fn main() -> std::process::ExitCode {
    handoff::cli::main()
}
