//! The front's own refusals: an overloaded model's 429 written from a request's head
//! without waking Python, by the rule Python publishes (web/front_rule.py `FrontRule`).
//!
//! Python gives the routes once (`Front.shed_routes`: every inference path of a ready model
//! version, with its metric series and error template, and the rule's settings) and the
//! state per loop turn (`Front.shed_state`: each target's expected queue wait, whether new
//! work may be refused here at all, until when the access log leaves refusals out). A
//! request is refused here only where Python's head decision (`HttpLifecycle._head`, then
//! `shed_early`) would refuse it with what it was told; anything else (another content type
//! or coding, a CORS request, an unusual timeout header, a log line due, a state older than
//! `MAX_AGE`) goes to Python as before, and Python decides it there. A published wait is
//! aged by the time since it was published (`wait - elapsed`, never below 0) for the
//! decision: a queue only drains while Python says nothing, so the front never refuses on
//! more than Python saw; the answer says the wait as published (the model's estimate).
//! Each refusal's metric series and duration wait in `refused` until Python counts them
//! (`Front.refused`, as the request metrics and the access log's left-out count): on its
//! next loop turn, which the front brings about within `COUNT_WITHIN` of the first one
//! waiting (one wake-up for all the refusals of that time, not one each).

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use hyper::{HeaderMap, Method, StatusCode};

/// The markers of Python's error template (`FrontRule.MESSAGE`, `FrontRule.REQUEST_ID`).
pub const MESSAGE_MARK: &str = "@@message@@";
pub const REQUEST_ID_MARK: &str = "@@request_id@@";

/// The longest a refusal written here waits to be counted by Python (its loop woken then,
/// if nothing woke it before).
pub const COUNT_WITHIN: std::time::Duration = std::time::Duration::from_millis(10);

pub type Hdrs = Vec<(HeaderName, HeaderValue)>;

/// One inference path of a ready model version: which wait it reads (`target`), which
/// metric series counts its refusals, which error template answers them.
#[derive(Clone, Copy)]
pub struct PathRule {
    pub target: usize,
    pub series: usize,
    pub template: usize,
}

/// What Python gives once, and again when the repository changes.
pub struct Routes {
    pub paths: HashMap<String, PathRule>,
    /// The error answer's headers (content-type; without content-length and retry-after)
    /// and body, with `MESSAGE_MARK` and `REQUEST_ID_MARK` where they go.
    pub templates: Vec<(Hdrs, String)>,
    pub request_timeout_s: f64,
    pub max_queue_wait_s: f64,
    pub retry_after_s: f64,
    /// CORS is on: a request with an Origin goes to Python (its headers are Python's).
    pub cors: bool,
    /// A state older than this (Python has not published for that long) refuses nothing.
    pub max_age_s: f64,
    /// lifecycle.py's SHED_MESSAGE and SHED_AFTER, with `{ahead}`, `{budget}`, `{waited}`
    /// and `{front}` where the figures go.
    pub message: String,
    pub after: String,
    /// Which client request ids the answer keeps (the access log's rule).
    pub ids: IdRule,
}

/// access_log.py's rule for a client's X-Request-Id (`ID_BYTES`, `ID_MAX`), as given: kept
/// when it has 1 to `max` of those bytes, else a new id is made.
pub struct IdRule {
    allowed: [bool; 256],
    max: usize,
}

impl IdRule {
    pub fn new(bytes: &[u8], max: usize) -> IdRule {
        let mut allowed = [false; 256];
        for &b in bytes {
            allowed[b as usize] = true;
        }
        IdRule { allowed, max }
    }

    fn keeps(&self, v: &[u8]) -> bool {
        !v.is_empty() && v.len() <= self.max && v.iter().all(|&b| self.allowed[b as usize])
    }
}

/// What Python gives per loop turn.
pub struct State {
    /// Each target's expected wait in seconds; -1: not measured; NaN: not ready (no
    /// refusal here).
    pub waits: Vec<f64>,
    /// When it was published (CLOCK_MONOTONIC seconds).
    pub at: f64,
    /// False: refuse nothing here (draining, or the process holds max_in_flight).
    pub open: bool,
    /// Until when a refusal's access line is left out (before it: due, Python logs it).
    pub log_until: f64,
}

#[derive(Default)]
pub struct Shed {
    pub rule: Option<(Routes, State)>,
    /// (series, seconds) of each refusal written here, until Python counts them (taken with
    /// the routes they name when those change: `Front.shed_routes`).
    pub refused: Vec<(usize, f64)>,
}

/// The refusal of a request with a whole body (`method`, `path`, `headers`) read at
/// `received`, at `now`, when the published rule says so, and whether it is the first that
/// waits to be counted; None: Python decides.
pub fn refusal(shed: &Mutex<Shed>, method: &Method, path: &str, headers: &HeaderMap,
               received: f64, now: f64) -> Option<(StatusCode, Hdrs, Bytes, bool)> {
    if method != Method::POST {
        return None;
    }
    let mut g = shed.lock().unwrap();
    let (routes, state) = g.rule.as_ref()?;
    if !state.open || now - state.at > routes.max_age_s || now < state.at
        || now >= state.log_until {
        return None;
    }
    let rule = *routes.paths.get(path)?;
    let w = *state.waits.get(rule.target)?;
    if w.is_nan() {
        return None;
    }
    let (wait, aged) = if w < 0.0 {
        (None, None)
    } else {
        (Some(w), Some((w - (now - state.at)).max(0.0)))
    };
    let asked = read_head(headers, routes)?;
    let timeout = asked.timeout.map_or(routes.request_timeout_s, |t| t.min(routes.request_timeout_s));
    let budget = timeout.min(routes.max_queue_wait_s);
    let waited = now - received;
    if !(waited > budget || aged.map_or(false, |w| waited + w > budget)) {
        return None;
    }
    let ahead = wait.unwrap_or(0.0);
    let after = if waited >= 0.001 && ahead <= budget {
        routes.after.replace("{waited}", &format!("{:.3}", waited))
    } else {
        String::new()
    };
    let message = routes.message.replace("{ahead}", &format!("{:.3}", ahead))
        .replace("{front}", &after).replace("{budget}", &format!("{:.3}", budget));
    let rid = match asked.request_id {
        Some(id) => id,
        None => new_id(),
    };
    let (template_headers, template_body) = routes.templates.get(rule.template)?;
    let body = template_body.replace(MESSAGE_MARK, &message).replace(REQUEST_ID_MARK, &rid);
    let retry = routes.retry_after_s.max(ahead).ceil().max(0.0) as u64;
    let mut out: Hdrs = template_headers.clone();
    out.push((CONTENT_LENGTH, HeaderValue::from(body.len())));
    out.push((HeaderName::from_static("retry-after"), HeaderValue::from(retry)));
    let total_ms = (super::monotonic() - now) * 1000.0;
    let timing = format!("queue;dur=0.000, compute;dur=0.000, total;dur={:.3}", total_ms);
    out.push((HeaderName::from_static("server-timing"), HeaderValue::from_str(&timing).ok()?));
    out.push((HeaderName::from_static("x-request-id"), HeaderValue::from_str(&rid).ok()?));
    let trace = traceparent(asked.traceparent.as_deref());
    out.push((HeaderName::from_static("traceparent"), HeaderValue::from_str(&trace).ok()?));
    let first = g.refused.is_empty();
    g.refused.push((rule.series, super::monotonic() - now));
    Some((StatusCode::TOO_MANY_REQUESTS, out, Bytes::from(body), first))
}

/// What the refusal reads of the headers.
struct Asked {
    timeout: Option<f64>,
    request_id: Option<String>,
    traceparent: Option<Vec<u8>>,
}

/// The headers a refusal here may answer (None: Python's: a content type or coding that is
/// not plain JSON, an Origin with CORS on, an X-Request-Timeout that is not a plain positive
/// number), with what the answer reads of them.
fn read_head(headers: &HeaderMap, routes: &Routes) -> Option<Asked> {
    let mut asked = Asked { timeout: None, request_id: None, traceparent: None };
    let mut typed = false;
    let mut timed = false;
    let mut named = false;
    for (name, value) in headers {
        match name.as_str() {
            "content-type" if !typed => {
                typed = true;
                if !plain_json(value.as_bytes()) {
                    return None;
                }
            }
            "content-encoding" => {
                let v = value.as_bytes();
                if !v.split(|&b| b == b',').all(|c| {
                    let c = strip(c);
                    c.is_empty() || c.eq_ignore_ascii_case(b"identity")
                }) {
                    return None;
                }
            }
            "origin" if routes.cors => return None,
            "x-request-timeout" if !timed => {
                timed = true;
                let t: f64 = std::str::from_utf8(value.as_bytes()).ok()?.parse().ok()?;
                if !(t > 0.0 && t.is_finite()) {
                    return None;  // (Python's 400)
                }
                asked.timeout = Some(t);
            }
            "x-request-id" if !named => {
                named = true;
                let v = value.as_bytes();
                if routes.ids.keeps(v) {
                    asked.request_id = Some(String::from_utf8_lossy(v).into_owned());
                }
            }
            "traceparent" if asked.traceparent.is_none() => {
                asked.traceparent = Some(value.as_bytes().to_vec());
            }
            _ => {}
        }
    }
    Some(asked)
}

/// `v` without the bytes of `set` at either end (`bytes.strip(set)`), without a copy.
fn trim<'a>(v: &'a [u8], set: &[u8]) -> &'a [u8] {
    let start = v.iter().position(|b| !set.contains(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !set.contains(b)).map_or(start, |i| i + 1);
    &v[start..end]
}

/// `bytes.strip()`: ASCII whitespace off both ends.
fn strip(v: &[u8]) -> &[u8] {
    trim(v, b" \t\n\r\x0b\x0c")
}

/// application/json or application/*+json, with a UTF-8 charset if one is given (what
/// Python's `_body_kind` reads as JSON; no content type is JSON too): the same steps on
/// bytes (strip, ASCII case folded), without allocating.
fn plain_json(value: &[u8]) -> bool {
    let mut parts = value.split(|&b| b == b';');
    let media = strip(parts.next().unwrap_or(b""));
    let prefix = b"application/";
    let json = media.eq_ignore_ascii_case(b"application/json")
        || media.len() >= prefix.len() + 5
            && media[..prefix.len()].eq_ignore_ascii_case(prefix)
            && media[media.len() - 5..].eq_ignore_ascii_case(b"+json");
    json && parts.all(|param| {
        let mut kv = param.splitn(2, |&b| b == b'=');
        if !strip(kv.next().unwrap_or(b"")).eq_ignore_ascii_case(b"charset") {
            return true;
        }
        let v = trim(strip(kv.next().unwrap_or(b"")), b"\"");
        v.eq_ignore_ascii_case(b"utf-8") || v.eq_ignore_ascii_case(b"utf8")
    })
}

/// access_log.py `Trace`: the request's traceparent continued (version 00, lower-case hex,
/// trace and parent ids not all zeros) under a new span of ours, else a new trace, not
/// sampled.
fn traceparent(value: Option<&[u8]>) -> String {
    let span = nonzero(next_u64());
    if let Some(v) = value {
        let v = std::str::from_utf8(v).unwrap_or("").trim_matches(|c: char| c.is_ascii_whitespace());
        let parts: Vec<&str> = v.split('-').collect();
        let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if parts.len() == 4 && parts[0] == "00" && hex(parts[1], 32) && hex(parts[2], 16)
            && hex(parts[3], 2) && parts[1].bytes().any(|b| b != b'0')
            && parts[2].bytes().any(|b| b != b'0') {
            return format!("00-{}-{:016x}-{}", parts[1], span, parts[3]);
        }
    }
    let trace = ((next_u64() as u128) << 64) | next_u64() as u128;
    format!("00-{:032x}-{:016x}-00", if trace == 0 { 1 } else { trace }, span)
}

fn nonzero(v: u64) -> u64 {
    if v == 0 { 1 } else { v }
}

/// access_log.py `new_id`: a random version-4 UUID as 32 hex digits.
fn new_id() -> String {
    let v = ((next_u64() as u128) << 64) | next_u64() as u128;
    let clear = !((0xFu128 << 76) | (0x3u128 << 62));
    let set = (0x4u128 << 76) | (0x2u128 << 62);
    format!("{:032x}", v & clear | set)
}

thread_local! {
    static RNG: std::cell::Cell<u64> = std::cell::Cell::new(seed());
}

fn seed() -> u64 {
    let mut s: u64 = 0;
    unsafe {
        libc::getrandom(&mut s as *mut u64 as *mut libc::c_void, 8, 0);
    }
    s ^ (super::monotonic().to_bits())
}

/// splitmix64: ids that correlate, not secrets (as Python's own `new_id`).
fn next_u64() -> u64 {
    RNG.with(|r| {
        let x = r.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        r.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}
