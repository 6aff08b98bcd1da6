//! A headless Chromium (Debian's `chromium`, under its `chromedriver`)
//! driven over WebDriver, for the console's tests and its bench. Without
//! a browser, [`Browser::start`] says so and gives `None`; under `CI=true`
//! a missing browser fails.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// How long a page has to show what is waited for.
const BOUND: Duration = Duration::from_secs(60);

/// One browser at a time: each is a few hundred MiB and a core's worth of
/// start-up on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A headless Chromium under its own chromedriver, and a WebDriver session.
pub(crate) struct Browser {
    driver: Child,
    client: Option<Client>,
    runtime: tokio::runtime::Runtime,
    _profile: tempfile::TempDir,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// The port a chromedriver started with `--port=0` listens on, as it
/// says on its output ("started successfully on port N"); the rest of its
/// output is read and dropped, so it never blocks on a full pipe.
fn driver_port(driver: &mut Child) -> u16 {
    use std::io::BufRead;
    let out = driver.stdout.take().expect("chromedriver's output");
    let mut lines = std::io::BufReader::new(out).lines();
    let port = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            let (_, rest) = line.split_once("started successfully on port ")?;
            rest.trim_end_matches('.').parse().ok()
        })
        .expect("chromedriver did not say its port");
    std::thread::spawn(move || lines.for_each(drop));
    port
}

impl Browser {
    /// A browser `width` × `height`, or `None` (with a note) where the
    /// machine has none, unless `CI=true`.
    pub(crate) fn start(width: u32, height: u32) -> Option<Browser> {
        let chromium =
            std::env::var("SCHEDULER_TEST_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
        let driver =
            std::env::var("SCHEDULER_TEST_CHROMEDRIVER").unwrap_or("/usr/bin/chromedriver".into());
        if !Path::new(&chromium).exists() || !Path::new(&driver).exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but there is no browser: {chromium} and {driver} are needed (apt-get install chromium chromium-driver)"
            );
            eprintln!("note: no {chromium} or {driver}; the console's browser test is skipped");
            return None;
        }
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let mut driver = Command::new(&driver)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let port = driver_port(&mut driver);
        let profile = tempfile::tempdir().expect("profile dir");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let mut capabilities = serde_json::Map::new();
        let mut options = json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-extensions",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ],
        });
        // A window is at least 500 pixels wide: a phone's width is emulated.
        if width < 500 {
            options["mobileEmulation"] = json!({
                "deviceMetrics": { "width": width, "height": height, "pixelRatio": 2 },
            });
        }
        capabilities.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{port}");
        let client = runtime.block_on(async {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            let mut last = None;
            for _ in 0..100 {
                match ClientBuilder::new(connector.clone())
                    .capabilities(capabilities.clone())
                    .connect(&url)
                    .await
                {
                    Ok(client) => return client,
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            panic!("no WebDriver session: {last:?}")
        });
        Some(Browser {
            driver,
            client: Some(client),
            runtime,
            _profile: profile,
            _turn: turn,
        })
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("session")
    }

    pub(crate) fn goto(&self, url: &str) {
        self.runtime
            .block_on(self.client().goto(url))
            .expect("navigate");
    }

    /// Runs `script` in the page (a promise it returns is waited for).
    pub(crate) fn eval(&self, script: &str) -> Value {
        self.runtime
            .block_on(self.client().execute(script, Vec::new()))
            .unwrap_or_else(|e| panic!("script {script}: {e}"))
    }

    /// Waits until `css` matches an element.
    pub(crate) fn wait_for(&self, css: &str) {
        let script = format!("return document.querySelector({}) !== null", json!(css));
        self.until(css, || self.eval(&script) == json!(true));
    }

    /// Waits until `check` holds, or fails naming `what`. (Its own poll:
    /// the console's bench shares this file, not the tests' support.)
    pub(crate) fn until(&self, what: &str, mut check: impl FnMut() -> bool) {
        let start = Instant::now();
        while !check() {
            assert!(start.elapsed() < BOUND, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clicks the first element `css` matches. A page that redraws (a
    /// list refreshed by its poll) can replace the element between its
    /// finding and the click: WebDriver then answers "stale element" and
    /// nothing was clicked, so it is found again and clicked.
    pub(crate) fn click(&self, css: &str) {
        self.until(&format!("a click on {css} that is not stale"), || {
            self.wait_for(css);
            let clicked = self
                .runtime
                .block_on(async { self.client().find(Locator::Css(css)).await?.click().await });
            match clicked {
                Ok(()) => true,
                Err(e) if e.to_string().contains("stale element") => false,
                Err(e) => panic!("click {css}: {e}"),
            }
        });
    }

    pub(crate) fn type_into(&self, css: &str, text: &str) {
        self.wait_for(css);
        self.runtime
            .block_on(async {
                self.client()
                    .find(Locator::Css(css))
                    .await?
                    .send_keys(text)
                    .await
            })
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// The text of the first element `css` matches.
    pub(crate) fn text(&self, css: &str) -> String {
        self.wait_for(css);
        let script = format!("return document.querySelector({}).textContent", json!(css));
        self.eval(&script).as_str().unwrap_or_default().to_owned()
    }

    pub(crate) fn screenshot(&self, path: &Path) {
        let png = self
            .runtime
            .block_on(self.client().screenshot())
            .expect("screenshot");
        std::fs::write(path, png).expect("write the screenshot");
    }

    /// Logs in at `base` with `token` and waits for the jobs view.
    pub(crate) fn log_in(&self, base: &str, token: &str) {
        self.goto(&format!("{base}/"));
        self.type_into("#token", token);
        self.click("#login button[type=submit]");
        self.wait_for(".job[data-job]");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = self.runtime.block_on(client.close());
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
