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
    std::sync::Arc::unwrap_or_clone(config.jobs.into_iter().next().expect("one job"))
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
    /// The scheduler with `args`, run in the workspace. It is killed when
    /// the thread that started it ends: a test that fails leaves no
    /// `serve` of its own running on, holding database connections.
    pub fn command(&self, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_scheduler"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env_remove("DATABASE_URL")
            .env_remove("SCHEDULER_CONFIG")
            .env_remove("SCHEDULER_LOG")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        // SAFETY: `prctl` is async-signal-safe, and the closure touches no
        // memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
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

/// Where the tests find PostgreSQL.
pub fn postgres_admin_url() -> String {
    std::env::var("SCHEDULER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A database of a test's own: a SQLite file in a temp dir, or a fresh
/// PostgreSQL database dropped when the test ends.
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("test.db").display());
        TestDb {
            url,
            pg_name: None,
            _dir: Some(dir),
        }
    }

    /// `None` (with a note) where no server answers, unless `CI=true`.
    pub async fn postgres() -> Option<TestDb> {
        use sqlx::Connection;
        let admin = postgres_admin_url();
        let mut conn = match sqlx::PgConnection::connect(&admin).await {
            Ok(conn) => conn,
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!(
                    "skipping: no PostgreSQL at {admin} ({e}); set SCHEDULER_TEST_DATABASE_URL"
                );
                return None;
            }
            Err(e) => panic!("CI=true but PostgreSQL at {admin} is unreachable: {e}"),
        };
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "scheduler_test_{}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
            chrono::Utc::now().timestamp_micros() % 1_000_000
        );
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let mut url = url::Url::parse(&admin).expect("admin url");
        url.set_path(&name);
        Some(TestDb {
            url: url.to_string(),
            pg_name: Some(name),
            _dir: None,
        })
    }

    pub async fn store(&self) -> scheduler::store::Store {
        let store = scheduler::store::Store::connect(&self.url)
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        store
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(name) = self.pg_name.take() else {
            return;
        };
        // Dropping needs its own runtime: the test's may be gone.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    use sqlx::Connection;
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                        let _ =
                            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                                .execute(&mut conn)
                                .await;
                    }
                });
            }
        })
        .join();
    }
}

impl TestDb {
    /// The same from synchronous code.
    pub fn postgres_blocking() -> Option<TestDb> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(TestDb::postgres())
    }
}

/// The databases a multi-process test runs against: SQLite always,
/// PostgreSQL where a server answers.
pub fn databases() -> Vec<TestDb> {
    let mut dbs = vec![TestDb::sqlite()];
    dbs.extend(TestDb::postgres_blocking());
    dbs
}

/// Waits for `child` to exit, failing the test if it takes longer than a
/// generous bound (hang detection only).
pub fn wait(mut child: std::process::Child, bound: std::time::Duration) -> Output {
    let start = std::time::Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "process still running after {bound:?}\nstdout: {}\nstderr: {}",
                out.stdout(),
                out.stderr()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Polls `check` until it is true, failing after `bound`.
pub fn eventually(what: &str, bound: std::time::Duration, check: impl FnMut() -> bool) {
    assert!(within(bound, check), "timed out waiting for {what}");
}

/// Polls `check` every 20 ms until it is true (`true`) or `bound` has
/// passed (`false`), for a test that cleans up, or says more, before it
/// fails.
pub fn within(bound: std::time::Duration, check: impl FnMut() -> bool) -> bool {
    polled(std::time::Duration::from_millis(20), bound, check)
}

/// [`within`], polling every `every`: for a check that costs the system
/// under test (a query of a database a burst is writing to).
pub fn polled(
    every: std::time::Duration,
    bound: std::time::Duration,
    mut check: impl FnMut() -> bool,
) -> bool {
    let start = std::time::Instant::now();
    loop {
        if check() {
            return true;
        }
        if start.elapsed() >= bound {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// An every-second job, one run per fire, that appends its fire to `file`:
/// a witness beside the jobs under test whose runs count the serve loop's
/// own progress, so that "nothing more happened" is watched for so many
/// fires rather than so many seconds.
pub fn ticker(name: &str, file: &str) -> String {
    format!(
        "\n[[job]]\nname = \"{name}\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\n\
         shell = 'echo $SCHEDULER_PERIOD >> {file}'\n"
    )
}

/// Waits until `file` holds `more` lines beyond those it holds now (a
/// [`ticker`]'s fires), failing after a generous bound.
pub fn more_lines(file: impl AsRef<Path>, more: usize) {
    let file = file.as_ref();
    let now = lines(file).len();
    eventually(
        &format!("{more} more lines in {}", file.display()),
        std::time::Duration::from_secs(60),
        || lines(file).len() >= now + more,
    );
}

/// Waits until the serve listening at `addr` has fired `job` (an
/// every-second one) through `seconds` more seconds, as its next-fire gauge
/// in `/metrics` says: the loop's own progress, seen in the job under test.
pub fn fired_on(addr: &str, job: &str, seconds: u32) {
    fired_on_each(&[addr], job, seconds);
}

/// [`fired_on`] for every serve listening at `addrs`: each replica's own
/// loop has fired `job` through `seconds` more seconds.
pub fn fired_on_each(addrs: &[&str], job: &str, seconds: u32) {
    let series = format!("scheduler_next_fire_timestamp_seconds{{job=\"{job}\"}}");
    let next = |addr: &str| crate::serve::metric(&http_get(addr, "/metrics"), &series);
    let mut until = Vec::new();
    for addr in addrs {
        let mut from = None;
        eventually(
            &format!("{job}'s next-fire gauge at {addr}"),
            std::time::Duration::from_secs(60),
            || {
                from = next(addr);
                from.is_some()
            },
        );
        until.push(from.unwrap_or_default() + f64::from(seconds));
    }
    eventually(
        &format!("{seconds} more seconds of fires of {job} on each replica"),
        std::time::Duration::from_secs(60),
        || {
            addrs
                .iter()
                .zip(&until)
                .all(|(addr, until)| next(addr).is_some_and(|at| at >= *until))
        },
    );
}

/// Whether the workspace's `serve.log` holds `text` `times` times or more.
pub fn logged(ws: &Workspace, text: &str, times: usize) -> bool {
    std::fs::read_to_string(ws.path().join("serve.log"))
        .unwrap_or_default()
        .matches(text)
        .count()
        >= times
}

/// Whether a process with this pid still exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

/// The lines of a file in the workspace, or none.
pub fn lines(path: impl AsRef<Path>) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A TCP proxy a test owns, to cut a database's connections without
/// touching the shared server.
pub struct Proxy {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    open: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    pub fn start(upstream: std::net::SocketAddr) -> Proxy {
        use std::sync::atomic::Ordering;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (cut2, open2, stalled2, held2) =
            (cut.clone(), open.clone(), stalled.clone(), held.clone());
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if cut2.load(Ordering::SeqCst) {
                    continue;
                }
                let stalled = stalled2.clone();
                let held = held2.clone();
                let task = tokio::spawn(async move {
                    if let Ok(server) = tokio::net::TcpStream::connect(upstream).await {
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::join!(
                            relay(client_read, server_write, stalled.clone(), held.clone()),
                            relay(server_read, client_write, stalled, held),
                        );
                    }
                });
                open2.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy {
            port,
            cut,
            stalled,
            held,
            open,
            _runtime: runtime,
        }
    }

    /// Keeps every connection open but passes no byte either way: the
    /// server is alive, the path to it is not.
    pub fn stall(&self) {
        self.stalled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many reads the proxy has held back while stalled: more than
    /// none once a process waits on the stalled path.
    pub fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for task in self.open.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
        self.stalled
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// `url` pointed at this proxy.
    pub fn url(&self, url: &str) -> String {
        let mut url = url::Url::parse(url).expect("url");
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(self.port)).expect("port");
        url.to_string()
    }
}

/// Copies bytes from `from` to `to`, holding them while `stalled` (and
/// counting each read it holds in `held`).
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.load(std::sync::atomic::Ordering::SeqCst) {
            held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        while stalled.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A private PostgreSQL server with password authentication, in a temp
/// dir on its own port, stopped when dropped. `None` (with a note) where
/// this machine cannot start one (no server binaries, not root).
pub struct PrivatePostgres {
    pub port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl PrivatePostgres {
    pub fn start(password: &str) -> Option<PrivatePostgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .find(|b| b.join("initdb").exists());
        let as_root = nix::unistd::Uid::effective().is_root();
        let (Some(bin), true) = (bin, as_root) else {
            skip("no PostgreSQL server binaries to run as the postgres user");
            return None;
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::write(dir.path().join("pw"), password).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let as_postgres = |program: &str, args: &[&str]| {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(bin.join(program))
                .args(args)
                .output()
                .expect("runuser")
        };
        Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir.path())
            .status()
            .unwrap();
        let pw = format!("--pwfile={}", dir.path().join("pw").display());
        let init = as_postgres(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "-A",
                "scram-sha-256",
                &pw,
            ],
        );
        assert!(
            init.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            dir.path().display()
        );
        let log = dir.path().join("log");
        let started = as_postgres(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &options,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        assert!(
            started.status.success(),
            "pg_ctl: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        Some(PrivatePostgres { port, dir, bin })
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args([
                "-D",
                data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "stop",
            ])
            .output();
    }
}

/// A proxy of the test's own in front of `db`, and `db`'s URL through it.
pub fn proxied(db: &TestDb) -> (Proxy, String) {
    let upstream = url::Url::parse(&db.url).expect("url");
    let addr = format!(
        "{}:{}",
        upstream.host_str().expect("host"),
        upstream.port().unwrap_or(5432)
    );
    let proxy = Proxy::start(addr.parse().expect("address"));
    let url = proxy.url(&db.url);
    (proxy, url)
}

/// Says why a test does nothing on this machine; under `CI=true`, where
/// the machine is made to have everything, it fails instead.
pub fn skip(why: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true, but {why}"
    );
    eprintln!("skipping: {why}");
}

/// `serve.log` in `ws`, opened for a process's log to be appended to.
pub fn serve_log(ws: &Workspace) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ws.path().join("serve.log"))
        .expect("serve.log")
}

/// The addresses the `serve --listen 127.0.0.1:0` processes whose log
/// goes to `log` bound, in the order they logged them: the port is the
/// kernel's pick at the bind, so no other test can take it first (a port
/// found free beforehand and released can be).
pub fn listened(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("serving the console"))
        .filter_map(|line| line.split(" addr=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The address the next `serve` logging to `log` binds, once it has:
/// the one after the `before` addresses [`listened`] read there before it
/// started. Fails after `bound` without one.
pub fn listening_at(log: &std::path::Path, before: usize, bound: std::time::Duration) -> String {
    let mut addr = None;
    eventually("the address serve bound", bound, || {
        addr = listened(log).into_iter().nth(before);
        addr.is_some()
    });
    addr.unwrap_or_default()
}

/// `GET path` from `addr`, the whole answer as text ("" if none).
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let _ = write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// One number from the test's database (0 for a statement that returns no
/// row, such as `CREATE TABLE`); a missing SQLite file is created.
pub fn count(url: &str, sql: &str) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use sqlx::Connection;
        if url.starts_with("sqlite:") {
            let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
            let mut conn = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
                .await
                .unwrap();
            let row: Option<i64> = sqlx::query_scalar(sql)
                .fetch_optional(&mut conn)
                .await
                .unwrap();
            row.unwrap_or(0)
        } else {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            let row: Option<i64> = sqlx::query_scalar(sql)
                .fetch_optional(&mut conn)
                .await
                .unwrap();
            // Said goodbye to, so that a test polling with it leaves no
            // backend behind it for the server to count.
            let _ = conn.close().await;
            row.unwrap_or(0)
        }
    })
}

/// The database's clock in `url`'s SQL, in the unit of its time columns
/// (milliseconds on SQLite, `timestamptz` on PostgreSQL): `lease_until <
/// {now}` holds on both once a lease has run out.
pub fn now_sql(url: &str) -> &'static str {
    if url.starts_with("sqlite:") {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    } else {
        "now()"
    }
}

/// `url`'s SQL for "`column` (a time) plus `ms` milliseconds is past", by
/// the database's clock.
pub fn past_sql(url: &str, column: &str, ms: u32) -> String {
    if url.starts_with("sqlite:") {
        format!("{column} + {ms} < {}", now_sql(url))
    } else {
        format!("{column} + interval '{ms} milliseconds' < now()")
    }
}

/// Whether the claim of `key` is running on a lease that has run out, by
/// the database's clock.
pub fn lease_over(url: &str, key: &str) -> bool {
    count(
        url,
        &format!(
            "SELECT count(*) FROM scheduler_claims WHERE period_key = '{key}' \
             AND state = 'running' AND lease_until < {}",
            now_sql(url)
        ),
    ) == 1
}

/// Whether the scheduler's tables are in the test's database yet (a
/// `serve` just started may not have made them).
pub fn migrated(url: &str) -> bool {
    let sql = if url.starts_with("sqlite:") {
        "SELECT count(*) FROM sqlite_master WHERE name = 'scheduler_attempts'"
    } else {
        "SELECT count(*) FROM pg_tables WHERE tablename = 'scheduler_attempts' AND schemaname = current_schema()"
    };
    count(url, sql) == 1
}

/// The text of each row a one-column query of a SQLite database returns.
pub fn sqlite_rows(url: &str, sql: &str) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use sqlx::Connection;
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
    })
}
