//! Test helpers: a temp dir with a jobs.toml, the binary run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chrono::{DateTime, Utc};
use scheduler::config::{Config, Job};

/// Parses an RFC 3339 instant.
pub fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .to_utc()
}

/// A single job parsed from a `[[job]]` body (no action needed).
pub fn job(body: &str) -> Job {
    let text = format!("[[job]]\nname = \"t\"\ncommand = [\"true\"]\n{body}\n");
    let config =
        Config::parse(Path::new("jobs.toml"), &text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    config.jobs.into_iter().next().expect("one job")
}

/// A temp dir holding a jobs.toml, where the binary runs.
pub struct Workspace {
    pub dir: tempfile::TempDir,
}

impl Workspace {
    pub fn new(jobs_toml: &str) -> Workspace {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("jobs.toml"), jobs_toml).expect("write jobs.toml");
        Workspace { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// The binary, in this dir, with a clean scheduler environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_scheduler"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env_remove("DATABASE_URL")
            .env_remove("SCHEDULER_CONFIG")
            .env_remove("SCHEDULER_LOG");
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("spawn scheduler")
    }
}

/// What a finished process said, for assertions.
pub trait Said {
    fn code(&self) -> i32;
    fn stdout(&self) -> String;
    fn stderr(&self) -> String;
}

impl Said for Output {
    fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}
