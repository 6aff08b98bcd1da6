//! The job supervisor as a binary of its own (see
//! `scheduler::engine::supervision`): small, so that it starts in a fraction
//! of the time the whole scheduler binary takes to load.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    scheduler::engine::supervision::child_main(&args);
}
