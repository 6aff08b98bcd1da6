//! `[scheduler]` and `[api]` checked: the process's settings, the API's
//! tokens and what each may do.

use std::time::Duration;

use chrono_tz::Tz;

use super::{at_least, duration, kept, positive, zone};
use crate::config::locator::Locator;
use crate::config::raw::{RawApi, RawSettings};
use crate::config::rules::{SHORTEST_LEASE, SHORTEST_SCAN, namespace_problem};
use crate::config::vars::Env;
use crate::config::{Allow, ApiSettings, ConfigError, DatabaseUrl, Secret, Settings, Token};
use crate::suggest::nearest;

impl RawSettings {
    pub(in crate::config) fn validate(
        self,
        at: &Locator,
        env: Env,
    ) -> Result<Settings, ConfigError> {
        let (database_url, database_url_error) = self.database_url(at, env)?;
        let namespace = match &self.namespace {
            Some(ns) if ns.get_ref().is_empty() => None,
            Some(ns) if let Some(problem) = namespace_problem(ns.get_ref()) => {
                return Err(at.error(ns.span(), problem));
            }
            Some(ns) => Some(ns.get_ref().clone()),
            None => None,
        };
        // Every mistake of the section at once.
        let mut errors = Vec::new();
        let timezone = kept(
            &mut errors,
            self.timezone.as_ref().map_or(Ok(Tz::UTC), |z| zone(at, z)),
        );
        // Heartbeats come every lease/3 and a runner stops its job a
        // heartbeat before its lease runs out: below a second that leaves
        // no time for a database round trip.
        let lease = kept(
            &mut errors,
            at_least(at, ("lease", self.lease.as_ref()), "60s", SHORTEST_LEASE),
        );
        let catch_up = kept(&mut errors, duration(at, self.catch_up.as_ref(), "24h"));
        let grace = kept(
            &mut errors,
            duration(at, self.shutdown_grace.as_ref(), "30s"),
        );
        let max_running = kept(&mut errors, positive(at, self.max_running.as_ref(), 16));
        let scan_interval = kept(
            &mut errors,
            at_least(
                at,
                ("scan_interval", self.scan_interval.as_ref()),
                "5s",
                SHORTEST_SCAN,
            ),
        );
        let (
            Some(timezone),
            Some(lease),
            Some(catch_up),
            Some(shutdown_grace),
            Some(max_running),
            Some(scan_interval),
        ) = (timezone, lease, catch_up, grace, max_running, scan_interval)
        else {
            return Err(ConfigError::joined(errors));
        };
        Ok(Settings {
            namespace,
            timezone,
            lease,
            catch_up,
            shutdown_grace,
            max_running: max_running as usize,
            scan_interval,
            database_url,
            database_url_error,
        })
    }

    /// `database_url`, its `${VAR}`s expanded; read leniently (`check`),
    /// the error of a URL whose variable is unset, kept for the command
    /// that opens the database.
    fn database_url(
        &self,
        at: &Locator,
        env: Env,
    ) -> Result<(Option<DatabaseUrl>, Option<ConfigError>), ConfigError> {
        let mut database_url_error = None;
        let database_url = match &self.database_url {
            Some(url) => {
                let expanded = crate::template::expand_env(url.get_ref(), &|name| env.strict(name))
                    .map_err(|e| at.template_error(url.span(), e));
                match expanded {
                    Ok(expanded) => Some(
                        DatabaseUrl::parse(&expanded, &at.directory())
                            .map_err(|e| at.error(url.span(), format!("`database_url`: {e}")))?,
                    ),
                    // Read leniently (`check`), an unset variable in the URL
                    // is a warning; a command that opens the database says
                    // it is missing. The URL is never guessed without it.
                    Err(e) if env.is_lenient() => {
                        let before = env.unset_count();
                        let _ = crate::template::expand_env(url.get_ref(), &|name| env.get(name));
                        if env.unset_count() == before {
                            return Err(e);
                        }
                        database_url_error = Some(e);
                        None
                    }
                    Err(e) => return Err(e),
                }
            }
            None => None,
        };
        Ok((database_url, database_url_error))
    }
}

/// The shortest secret a token may have: long enough not to be guessed.
const SHORTEST_SECRET: usize = 16;

impl RawApi {
    pub(in crate::config) fn validate(
        self,
        at: &Locator,
        env: Env,
    ) -> Result<ApiSettings, ConfigError> {
        let key_ttl = at_least(
            at,
            ("key_ttl", self.key_ttl.as_ref()),
            "24h",
            Duration::from_secs(60),
        )?;
        let mut tokens: Vec<Token> = Vec::with_capacity(self.tokens.len());
        for raw in self.tokens {
            let raw = raw.into_inner();
            let name = raw.name.get_ref();
            let name_ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !name_ok {
                return Err(at.error(
                    raw.name.span(),
                    format!("token name `{name}`: expected letters, digits, `-`, `_` or `.`, e.g. \"ci\""),
                ));
            }
            if tokens.iter().any(|t| t.name == *name) {
                return Err(at.error(
                    raw.name.span(),
                    format!("token name `{name}` is used twice; each token needs its own name"),
                ));
            }
            let unset = env.unset_count();
            let secret = crate::template::expand_env(raw.secret.get_ref(), &|n| env.get(n))
                .map_err(|e| at.template_error(raw.secret.span(), e))?;
            // Read leniently (`check`, `status`), an unset variable leaves
            // the secret empty (a warning): those commands serve no API.
            let complete = env.unset_count() == unset;
            if complete && secret.trim() != secret {
                return Err(at.error(
                    raw.secret.span(),
                    format!("the secret of token `{name}` begins or ends with blanks, which no Authorization header can carry; expected e.g. the output of `openssl rand -hex 32`"),
                ));
            }
            if complete && secret.chars().count() < SHORTEST_SECRET {
                return Err(at.error(
                    raw.secret.span(),
                    format!(
                        "the secret of token `{name}` is {} character(s) long: expected at least {SHORTEST_SECRET}, e.g. from `openssl rand -hex 32`",
                        secret.chars().count()
                    ),
                ));
            }
            env.note_secret(&secret);
            let secret = Secret::new(&secret);
            if !secret.is_empty() && tokens.iter().any(|t| t.secret == secret) {
                return Err(at.error(
                    raw.secret.span(),
                    format!("the secret of token `{name}` is another token's too; each token needs its own"),
                ));
            }
            let allow = allowed(at, &raw.allow, name)?;
            tokens.push(Token {
                name: name.clone(),
                secret,
                allow,
            });
        }
        Ok(ApiSettings { key_ttl, tokens })
    }
}

/// What a token's `allow` list allows; it must allow something.
fn allowed(
    at: &Locator,
    words: &toml::Spanned<Vec<toml::Spanned<String>>>,
    name: &str,
) -> Result<Allow, ConfigError> {
    let mut allow = Allow::default();
    for word in words.get_ref() {
        match word.get_ref().as_str() {
            "read" => allow.read = true,
            "trigger" => allow.trigger = true,
            "operate" => allow.operate = true,
            other => {
                let hint = nearest(other, ["read", "trigger", "operate"])
                    .map(|n| format!("; did you mean `{n}`?"))
                    .unwrap_or_default();
                return Err(at.error(
                    word.span(),
                    format!("unknown permission `{other}`, expected `read`, `trigger` or `operate`{hint}"),
                ));
            }
        }
    }
    if allow == Allow::default() {
        return Err(at.error(
            words.span(),
            format!(
                "token `{name}` allows nothing: expected some of \"read\", \"trigger\", \"operate\""
            ),
        ));
    }
    Ok(allow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::vars::Vars;

    #[test]
    fn the_settings_given_in_code_default_to_those_of_an_empty_scheduler_table() {
        let at = Locator {
            path: std::path::Path::new(""),
            text: "",
        };
        let none = |_: &str| None;
        let table = RawSettings::default()
            .validate(&at, &Vars::new(&none, false))
            .expect("an empty table is valid");
        let code = Settings::defaults();
        assert_eq!(format!("{table:?}"), format!("{code:?}"));
    }
}
