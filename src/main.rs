//! The `handoff` binary: everything is in the library's [`handoff::cli`].

/// mimalloc: measured faster than glibc malloc on the proxy's many small, short-lived
/// allocations (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    handoff::cli::main()
}
