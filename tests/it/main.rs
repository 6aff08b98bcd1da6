//! All integration tests in one binary: the pure core (periods, DST,
//! properties), the command line as a user runs it, and the store on both
//! backends.

mod actions;
mod after;
mod api;
mod browser;
mod burst;
mod calendars;
mod cli_config;
mod cli_run;
mod console;
mod docs;
mod dst;
mod edges;
mod embed;
mod labels;
mod layout;
mod library;
mod never_twice;
mod notify;
mod once_at_the_edges;
mod one_meaning;
mod ops;
mod output;
mod properties;
mod scale;
mod schema;
mod secrets;
mod serve;
mod shards;
mod store;
mod support;
mod traces;
