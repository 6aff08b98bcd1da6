//! A stored run as the API shows it, whole (`GET /v1/runs/{id}`, a
//! replayed `POST`) or in a list (`GET /v1/runs`).

use serde_json::{Value, json};

use crate::store::{ApiRun, ApiRunState};

/// A stored run as the API shows it: `abandoned` when its replica stopped
/// keeping it alive (its periods are recovered like any others).
pub(super) fn run_body(run: &ApiRun) -> Value {
    let state = match (run.state, run.alive) {
        (ApiRunState::Running, 0) => "abandoned",
        (state, _) => state.as_str(),
    };
    let mut body: Value = serde_json::from_str(&run.body).unwrap_or_else(|_| json!({}));
    if state == "abandoned" {
        // What its replica last wrote: a period it was running is now the
        // scan's to recover (`GET /v1/jobs/{job}/periods/{label}` says how).
        if let Some(periods) = body["periods"].as_array_mut() {
            for period in periods.iter_mut().filter(|p| p["status"] == "running") {
                period["status"] = json!("abandoned");
            }
        }
        body["outcome"] = json!("abandoned");
        body["error"] = json!(
            "its replica stopped: a period listed as abandoned is recovered by the scan like any expired claim; a period of the request not listed may have been claimed just before the replica stopped, so look at it first (GET /v1/jobs/{job}/periods/{label}): the scan recovers one that was claimed; POST only the periods that are missing again, with a new Idempotency-Key"
        );
    }
    body["id"] = json!(run.id);
    body["job"] = json!(run.job);
    body["requested_by"] = json!(run.requested_by);
    body["owner"] = json!(run.owner);
    body["state"] = json!(state);
    body
}

/// A run in a list (`GET /v1/runs`): [`run_body`] with, instead of every
/// period's line, how many periods ended how (`running` for those under
/// way) and when it was asked for.
pub(super) fn run_summary(run: &ApiRun) -> Value {
    let mut body = run_body(run);
    let periods = body
        .as_object_mut()
        .and_then(|b| b.remove("periods"))
        .unwrap_or_default();
    let periods = periods.as_array().map_or(&[][..], Vec::as_slice);
    let mut counts = serde_json::Map::new();
    for period in periods {
        let status = period["status"].as_str().unwrap_or("unknown").to_owned();
        let n = counts.get(&status).and_then(Value::as_u64).unwrap_or(0);
        counts.insert(status, json!(n + 1));
    }
    body["counts"] = Value::Object(counts);
    body["periods_listed"] = json!(periods.len());
    body["created_at"] =
        json!(chrono::DateTime::from_timestamp_millis(run.created_at).map(crate::period::utc_text));
    body
}
