//! Links libbraid. Where the library is, first match wins:
//!
//! 1. `BRAID_LIB_DIR`: the directory holding `libbraid.so` (e.g. the build
//!    directory `build/`, or `PREFIX/lib` after `make install`);
//! 2. `pkg-config braid` (set `PKG_CONFIG_PATH=PREFIX/lib/pkgconfig` for a
//!    non-system prefix);
//! 3. the linker's default search path.
//!
//! For 1 and 2 the directory is also written as a run path into this
//! package's tests, examples and binaries, so they start without
//! `LD_LIBRARY_PATH`. Programs of other packages that depend on this one get
//! the directory as `DEP_BRAID_LIB_DIR` for their own build scripts.
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=BRAID_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");
    let mut dirs: Vec<String> = Vec::new();
    match env::var("BRAID_LIB_DIR") {
        Ok(d) if !d.is_empty() => dirs.push(d),
        _ => {
            if let Ok(out) = Command::new("pkg-config").args(["--libs-only-L", "braid"]).output() {
                if out.status.success() {
                    let s = String::from_utf8_lossy(&out.stdout);
                    for w in s.split_whitespace() {
                        if let Some(d) = w.strip_prefix("-L") {
                            dirs.push(d.to_string());
                        }
                    }
                }
            }
        }
    }
    for d in &dirs {
        println!("cargo:rustc-link-search=native={}", d);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", d);
    }
    if let Some(d) = dirs.first() {
        println!("cargo:lib_dir={}", d);
    }
    println!("cargo:rustc-link-lib=dylib=braid");
}
