//! The `handoff` binary: everything is in the library's [`handoff::cli`].
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// mimalloc: measured faster than glibc malloc on the proxy's many small, short-lived
/// allocations (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// mimalloc, called the way a C program calls it for what every block satisfies.
///
/// The `mimalloc` crate passes every request to `mi_malloc_aligned`. mimalloc 3 takes
/// its plain path there only for a small block whose page has one free; otherwise
/// (a block over 1 KiB, a page to refill), unless the size class is a power of two, it
/// over-allocates by the alignment and hands out an interior pointer: 2,100 more
/// instructions per small request, and bigger blocks. Every mimalloc block is aligned
/// to a machine word at least, so a request that asks no more goes to `mi_malloc` and
/// its kin; any other keeps the aligned path. The only `unsafe` in the workspace: the
/// library forbids it.
struct Allocator;

/// The alignment every mimalloc block has: its size classes are whole words.
const WORD: usize = std::mem::size_of::<usize>();

// SAFETY: each method hands mimalloc a request it serves with at least the layout's
// alignment (a word, or the aligned API beyond), and a block goes back to the family
// of functions it came from (`mi_free` frees either).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: plain allocation; word alignment covers this layout.
            unsafe { libmimalloc_sys::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded with the caller's own guarantees.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: as in `alloc`.
            unsafe { libmimalloc_sys::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded with the caller's own guarantees.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: `ptr` is a live mimalloc block; the new one is word-aligned too.
            unsafe { libmimalloc_sys::mi_realloc(ptr.cast::<c_void>(), new_size).cast() }
        } else {
            // SAFETY: forwarded with the caller's own guarantees.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}

fn main() -> std::process::ExitCode {
    // No transparent huge pages: mimalloc asks for them on its arenas, and the kernel
    // then zeroes 2 MB for each fresh one a burst touches, again after every purge. A
    // conversation that grows turn by turn spent about a third of its CPU there, and
    // the idle process held 10 MB of mostly empty huge pages (BENCHMARKS.md).
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    handoff::cli::main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_has_its_alignment_and_keeps_its_bytes_through_realloc() {
        let mut live = Vec::new();
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in (1..600).chain([1000, 1024, 1500, 4095, 4096, 10_000, 70_000, 300_000]) {
                let layout = Layout::from_size_align(size, align).unwrap();
                for zeroed in [false, true] {
                    // SAFETY: a non-zero size; every block is freed below with its layout.
                    let block = unsafe {
                        if zeroed {
                            ALLOCATOR.alloc_zeroed(layout)
                        } else {
                            ALLOCATOR.alloc(layout)
                        }
                    };
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "size {size} align {align}");
                    // SAFETY: the block holds `size` bytes.
                    let bytes = unsafe { std::slice::from_raw_parts_mut(block, size) };
                    if zeroed {
                        assert!(bytes.iter().all(|b| *b == 0), "size {size} align {align}");
                    }
                    bytes.fill(0xa5);
                    let grown = size * 3 + 1;
                    // SAFETY: `block` is live with `layout`; the new size is non-zero.
                    let moved = unsafe { ALLOCATOR.realloc(block, layout, grown) };
                    assert_eq!(
                        moved as usize % align,
                        0,
                        "realloc {size}->{grown} align {align}"
                    );
                    // SAFETY: the first `size` bytes were copied over.
                    let kept = unsafe { std::slice::from_raw_parts(moved, size) };
                    assert!(
                        kept.iter().all(|b| *b == 0xa5),
                        "realloc {size} align {align}"
                    );
                    live.push((moved, Layout::from_size_align(grown, align).unwrap()));
                }
            }
        }
        for (block, layout) in live {
            // SAFETY: each block is live, with this layout.
            unsafe { ALLOCATOR.dealloc(block, layout) };
        }
    }
}
