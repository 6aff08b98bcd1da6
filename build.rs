//! Links the binaries with their relative relocations packed (DT_RELR):
//! the 47,000 of `scheduler`, 24 bytes each, made 1.1 MB that the dynamic
//! loader read at every start and that then stayed resident; packed, they
//! are 18 KB. Only where the glibc the build runs on can load such a binary
//! (2.36 and later: Debian 12, Ubuntu 24.04, the Dockerfile's images) and
//! the build is for that machine; elsewhere the binaries link as before.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // sqlx::migrate! reads the directory when the crate builds: a new
    // migration must build it again.
    println!("cargo::rerun-if-changed=migrations");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    if native && glibc_loads_packed_relocations() {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc_loads_packed_relocations() -> bool {
    unsafe extern "C" {
        fn gnu_get_libc_version() -> *const std::ffi::c_char;
    }
    // SAFETY: glibc returns a static string, NUL-terminated.
    let version = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    let mut numbers = version
        .to_str()
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (major, minor) >= (2, 36)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc_loads_packed_relocations() -> bool {
    false
}
