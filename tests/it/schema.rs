//! The claim rule readable in one place: `schema/` holds the current text
//! of every function and trigger the migrations leave in a database, one
//! file each, compared here with a database freshly migrated. A migration
//! that changes one shows its whole new text as a diff of `schema/`;
//! `SCHEDULER_BLESS_SCHEMA=1` writes that text for review.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sqlx::Connection;

use crate::support::TestDb;

/// Compares what a migrated database holds (name → text) with the files
/// of `schema/<dir>` named `scheduler_*.sql`, or writes them when blessed.
fn compare(dir: &str, found: &BTreeMap<String, String>) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("schema")
        .join(dir);
    let kept: BTreeMap<String, String> = std::fs::read_dir(&root)
        .expect("schema dir")
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?.strip_suffix(".sql")?;
            name.starts_with("scheduler_").then(|| {
                let text = std::fs::read_to_string(&path).expect("schema file");
                (name.to_owned(), text)
            })
        })
        .collect();
    if std::env::var_os("SCHEDULER_BLESS_SCHEMA").is_some() {
        for name in kept.keys().filter(|name| !found.contains_key(*name)) {
            std::fs::remove_file(root.join(format!("{name}.sql"))).expect("remove");
        }
        for (name, text) in found {
            std::fs::write(root.join(format!("{name}.sql")), text).expect("write");
        }
        return;
    }
    let bless = "SCHEDULER_BLESS_SCHEMA=1 cargo test --test it schema:: writes what the migrations leave; review its diff";
    for (name, text) in found {
        match kept.get(name) {
            None => panic!("schema/{dir}/{name}.sql is missing; {bless}"),
            Some(kept) => assert!(
                kept == text,
                "schema/{dir}/{name}.sql is not what the migrations leave; {bless}\n--- kept\n{kept}\n--- migrated\n{text}"
            ),
        }
    }
    for name in kept.keys() {
        assert!(
            found.contains_key(name),
            "schema/{dir}/{name}.sql: no migration leaves it; {bless}"
        );
    }
}

#[tokio::test]
async fn every_postgresql_function_and_trigger_is_the_text_kept_in_schema() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    drop(db.store().await);
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let functions: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.proname::text, pg_get_functiondef(p.oid)
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = current_schema() AND p.proname LIKE 'scheduler%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let triggers: Vec<(String, String)> = sqlx::query_as(
        "SELECT tgname::text, pg_get_triggerdef(oid, true) || E'\\n' FROM pg_trigger
          WHERE NOT tgisinternal AND tgname LIKE 'scheduler%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut found = BTreeMap::new();
    for (name, text) in functions.into_iter().chain(triggers) {
        let again = found.insert(name.clone(), text);
        assert!(again.is_none(), "{name}: two bodies (an overload to drop?)");
    }
    assert!(found.contains_key("scheduler_claimable"), "{found:?}");
    compare("postgres", &found);
}

#[tokio::test]
async fn every_sqlite_trigger_is_the_text_kept_in_schema() {
    let db = TestDb::sqlite();
    drop(db.store().await);
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    let triggers: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, sql || char(10) FROM sqlite_master
          WHERE type = 'trigger' AND name LIKE 'scheduler%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let found: BTreeMap<String, String> = triggers.into_iter().collect();
    assert!(found.contains_key("scheduler_claims_wake"), "{found:?}");
    compare("sqlite", &found);
}
