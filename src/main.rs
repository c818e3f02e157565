//! The `handoff` binary: everything is in the library's [`handoff::cli`].

/// mimalloc: measured faster than glibc malloc on the proxy's many small, short-lived
/// allocations (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // No transparent huge pages: mimalloc asks for them on its arenas, and the kernel
    // then zeroes 2 MB for each fresh one a burst touches, again after every purge. A
    // conversation that grows turn by turn spent about a third of its CPU there, and
    // the idle process held 10 MB of mostly empty huge pages (BENCHMARKS.md).
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    handoff::cli::main()
}
