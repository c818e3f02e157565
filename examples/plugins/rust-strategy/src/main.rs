//! handoff with one more strategy kind: `cargo run -p handoff-example-strategy -- serve`.

fn main() -> std::process::ExitCode {
    handoff_example_strategy::register();
    handoff::cli::main()
}
