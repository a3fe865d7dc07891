//! Builds the interposer (preload/*.c) into a shared object that the `fragscope` binary
//! carries inside itself (see src/preload.rs), so `cargo install` is all a user needs.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("libfragscope_preload.so");
    let src = PathBuf::from("preload/fragscope_preload.c");
    println!("cargo:rerun-if-changed=preload/fragscope_preload.c");
    println!("cargo:rerun-if-changed=preload/hooks.h");
    println!("cargo:rerun-if-changed=preload/cpython.h");
    println!("cargo:rerun-if-changed=preload/attach.h");
    println!("cargo:rerun-if-changed=preload/samples.h");
    println!("cargo:rerun-if-changed=preload/sbcl.h");
    println!("cargo:rerun-if-changed=preload/connection.h");
    println!("cargo:rerun-if-changed=preload/buffers.h");
    println!("cargo:rerun-if-changed=preload/allocator_stats.h");
    println!("cargo:rerun-if-changed=preload/init.h");
    println!("cargo:rerun-if-changed=preload/survival.h");
    let compiler = cc::Build::new().opt_level(2).get_compiler();
    let status = Command::new(compiler.path())
        .args([
            "-std=gnu11",
            "-O2",
            "-g",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
        ])
        .args([
            "-ftls-model=initial-exec",
            "-fno-strict-aliasing",
            "-Wall",
            "-Wextra",
            // A call to a function not declared would otherwise build and fail only when
            // a program loads the interposer.
            "-Werror=implicit-function-declaration",
        ])
        .args(["-Wl,-z,now", "-Wl,--no-undefined", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-ldl", "-lpthread", "-lm"])
        .status()
        .expect("a C compiler (cc) is needed to build fragscope's interposer");
    assert!(status.success(), "building the interposer failed");
}
