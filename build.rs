//! Lists the migrations the crate embeds (`migrations/{sqlite,postgres}`),
//! so a new file is picked up without a line of code; and links the
//! binaries with their relative relocations packed (DT_RELR):
//! the 47,000 of `scheduler`, 24 bytes each, made 1.1 MB that the dynamic
//! loader read at every start and that then stayed resident; packed, they
//! are 18 KB. Only where the glibc the build runs on can load such a binary
//! (2.36 and later: Debian 12, Ubuntu 24.04, the Dockerfile's images) and
//! the build is for that machine; elsewhere the binaries link as before.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // A new or edited migration builds the crate again.
    println!("cargo::rerun-if-changed=migrations");
    for backend in ["sqlite", "postgres"] {
        list_migrations(backend);
    }
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    if native && glibc_loads_packed_relocations() {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Writes `$OUT_DIR/<backend>_migrations.rs`: the migrations of
/// `migrations/<backend>` in version order, each `(version, file name,
/// its text)`.
fn list_migrations(backend: &str) {
    let dir = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("migrations")
        .join(backend);
    let mut files: Vec<(i64, String)> = std::fs::read_dir(&dir)
        .expect("the migrations directory")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let version = name.strip_suffix(".sql")?.split('_').next()?.parse().ok()?;
            Some((version, name))
        })
        .collect();
    files.sort();
    let mut list = String::from("&[\n");
    for (version, name) in files {
        let path = dir.join(&name);
        list.push_str(&format!(
            "    ({version}, {name:?}, include_str!({path:?})),\n",
            path = path.display().to_string()
        ));
    }
    list.push_str("]\n");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").expect("out dir"))
        .join(format!("{backend}_migrations.rs"));
    std::fs::write(out, list).expect("the list of migrations");
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
