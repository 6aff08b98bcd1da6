//! The OpenTelemetry environment variables a trace exporter is set up
//! from, each checked: a value that cannot be used is an error naming its
//! variable, never a silent fallback.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry_sdk::trace::Sampler;

use crate::config::ConfigError;

/// How traces are exported.
pub(super) struct Settings {
    /// Where spans are posted: the `…/v1/traces` URL.
    pub endpoint: String,
    pub headers: HashMap<String, String>,
    pub timeout: Duration,
    pub sampler: Sampler,
    pub service: String,
    pub attributes: Vec<(String, String)>,
}

/// The variables read, for a test to hand in its own.
pub(super) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn refused(variable: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        place: variable.to_owned(),
        message: message.into(),
    }
}

/// The value of `variable`, or of its `_TRACES_` form, which wins; an
/// empty value is unset.
fn either(env: Env<'_>, general: &str) -> Option<(String, String)> {
    let traces = general.replacen("OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_", 1);
    [traces, general.to_owned()].into_iter().find_map(|name| {
        env(&name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v))
    })
}

impl Settings {
    /// The settings the environment asks for; `None`: tracing is off (no
    /// endpoint, `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`).
    pub(super) fn from_env(env: Env<'_>) -> Result<Option<Settings>, ConfigError> {
        let disabled = env("OTEL_SDK_DISABLED").map(|v| v.trim().to_ascii_lowercase());
        match disabled.as_deref() {
            None | Some("" | "false") => {}
            Some("true") => return Ok(None),
            Some(other) => {
                return Err(refused(
                    "OTEL_SDK_DISABLED",
                    format!("`{other}` is neither `true` nor `false`"),
                ));
            }
        }
        let exporter = env("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase());
        match exporter.as_deref() {
            None | Some("" | "otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(refused(
                    "OTEL_TRACES_EXPORTER",
                    format!("`{other}` is not built in; use `otlp` or `none`"),
                ));
            }
        }
        let Some((name, endpoint)) = either(env, "OTEL_EXPORTER_OTLP_ENDPOINT") else {
            return Ok(None);
        };
        Ok(Some(Settings {
            endpoint: endpoint_of(&name, &endpoint)?,
            headers: headers(env)?,
            timeout: timeout(env)?,
            sampler: sampler(env)?,
            service: service(env)?,
            attributes: attributes(env)?,
        }))
        .and_then(|settings| protocol(env).map(|()| settings))
    }
}

/// The traces URL: a `_TRACES_` endpoint as given, a general one with
/// `/v1/traces` added.
fn endpoint_of(name: &str, value: &str) -> Result<String, ConfigError> {
    let value = value.trim();
    let url = reqwest::Url::parse(value)
        .map_err(|e| refused(name, format!("`{value}` is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(refused(
            name,
            format!("`{value}` is not an http:// or https:// URL"),
        ));
    }
    // Credentials go in OTEL_EXPORTER_OTLP_HEADERS, where they are kept
    // out of the logs; a URL's would be logged, and a query string would
    // end up before the `/v1/traces` path.
    if !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(refused(
            name,
            "a user, password, query string or fragment in the endpoint is not sent as you would expect; give credentials in OTEL_EXPORTER_OTLP_HEADERS",
        ));
    }
    if name.contains("_TRACES_") {
        return Ok(value.to_owned());
    }
    Ok(format!("{}/v1/traces", value.trim_end_matches('/')))
}

fn protocol(env: Env<'_>) -> Result<(), ConfigError> {
    match either(env, "OTEL_EXPORTER_OTLP_PROTOCOL") {
        None => Ok(()),
        Some((_, value)) if value.trim().eq_ignore_ascii_case("http/protobuf") => Ok(()),
        Some((name, value)) => Err(refused(
            &name,
            format!(
                "`{}` is not built in; traces are sent as `http/protobuf`",
                value.trim()
            ),
        )),
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value` pairs, comma-separated, the
/// values percent-encoded.
fn headers(env: Env<'_>) -> Result<HashMap<String, String>, ConfigError> {
    let Some((name, value)) = either(env, "OTEL_EXPORTER_OTLP_HEADERS") else {
        return Ok(HashMap::new());
    };
    pairs(&name, &value)?
        .into_iter()
        .map(|(key, value)| {
            reqwest::header::HeaderName::from_bytes(key.as_bytes())
                .map_err(|_| refused(&name, format!("`{key}` is not a header name")))?;
            // The value is not said: it is likely a key.
            reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
                refused(
                    &name,
                    format!("the value of `{key}` cannot be sent in a header"),
                )
            })?;
            Ok((key, value))
        })
        .collect()
}

/// `key=value,key=value`, each value percent-decoded.
fn pairs(name: &str, value: &str) -> Result<Vec<(String, String)>, ConfigError> {
    value
        .split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let Some((key, value)) = item.split_once('=') else {
                return Err(refused(name, "an item is not `key=value`"));
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(refused(name, "an item has no key"));
            }
            // The value is not said: a header's is likely a key.
            let value = percent_decoded(value.trim())
                .ok_or_else(|| refused(name, format!("the value of `{key}` has a bad %-escape")))?;
            Ok((key.to_owned(), value))
        })
        .collect()
}

fn percent_decoded(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds (10 s by default).
fn timeout(env: Env<'_>) -> Result<Duration, ConfigError> {
    let Some((name, value)) = either(env, "OTEL_EXPORTER_OTLP_TIMEOUT") else {
        return Ok(Duration::from_secs(10));
    };
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(refused(
            &name,
            format!("`{value}` is not a number of milliseconds above 0"),
        )),
    }
}

/// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
fn sampler(env: Env<'_>) -> Result<Sampler, ConfigError> {
    let name = env("OTEL_TRACES_SAMPLER").unwrap_or_default();
    let ratio = || -> Result<f64, ConfigError> {
        let Some(arg) = env("OTEL_TRACES_SAMPLER_ARG").filter(|a| !a.trim().is_empty()) else {
            return Ok(1.0);
        };
        match arg.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(refused(
                "OTEL_TRACES_SAMPLER_ARG",
                format!("`{arg}` is not a ratio from 0 to 1"),
            )),
        }
    };
    let parent = |root: Sampler| Sampler::ParentBased(Box::new(root));
    Ok(match name.trim() {
        "" | "parentbased_always_on" => parent(Sampler::AlwaysOn),
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "parentbased_always_off" => parent(Sampler::AlwaysOff),
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_traceidratio" => parent(Sampler::TraceIdRatioBased(ratio()?)),
        other => {
            return Err(refused(
                "OTEL_TRACES_SAMPLER",
                format!(
                    "`{other}` is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ),
            ));
        }
    })
}

fn attributes(env: Env<'_>) -> Result<Vec<(String, String)>, ConfigError> {
    match env("OTEL_RESOURCE_ATTRIBUTES") {
        Some(value) => pairs("OTEL_RESOURCE_ATTRIBUTES", &value),
        None => Ok(Vec::new()),
    }
}

/// `OTEL_SERVICE_NAME`, else `service.name` of the resource attributes,
/// else `scheduler`.
fn service(env: Env<'_>) -> Result<String, ConfigError> {
    if let Some(name) = env("OTEL_SERVICE_NAME").filter(|n| !n.trim().is_empty()) {
        return Ok(name.trim().to_owned());
    }
    Ok(attributes(env)?
        .into_iter()
        .find(|(key, _)| key == "service.name")
        .map_or_else(|| "scheduler".to_owned(), |(_, value)| value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_env(&move |name| vars.get(name).cloned())
    }

    fn refusal(vars: &[(&str, &str)]) -> String {
        match settings(vars) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{vars:?} was taken"),
        }
    }

    const AT: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");

    #[test]
    fn no_endpoint_is_off_and_an_endpoint_gets_its_traces_path() {
        assert!(settings(&[]).unwrap().is_none());
        assert!(
            settings(&[AT, ("OTEL_SDK_DISABLED", "true")])
                .unwrap()
                .is_none()
        );
        let on = settings(&[AT]).unwrap().unwrap();
        assert_eq!(on.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(on.service, "scheduler");
        let traces = settings(&[
            AT,
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/x/traces"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=billing,team=pay%20ments",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(traces.endpoint, "https://c/x/traces");
        assert_eq!(traces.service, "billing");
        assert_eq!(traces.attributes[1], ("team".into(), "pay ments".into()));
    }

    #[test]
    fn each_bad_value_is_refused_naming_its_variable() {
        for (var, value, says) in [
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "collector:4318",
                "not an http",
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "::", "not a URL"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "not built in"),
            ("OTEL_TRACES_SAMPLER", "sometimes", "not one of"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s", "milliseconds"),
            ("OTEL_RESOURCE_ATTRIBUTES", "team", "not `key=value`"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://u:pw@c:4318",
                "HEADERS",
            ),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "api-key=a%0Ab",
                "cannot be sent",
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a b=1", "not a header name"),
            ("OTEL_SDK_DISABLED", "yes", "neither"),
        ] {
            let refused = refusal(&[AT, (var, value)]);
            assert!(
                refused.starts_with(&format!("{var}: ")) && refused.contains(says),
                "{var}={value}: {refused}"
            );
        }
        let refused = refusal(&[
            AT,
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ]);
        assert!(
            refused.starts_with("OTEL_TRACES_SAMPLER_ARG: "),
            "{refused}"
        );
    }
}
