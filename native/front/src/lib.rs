//! seqserve.service.server._front: a native HTTP/1.1 front for seqserve.
//!
//! hyper 0.14 serves connections on a tokio runtime in background threads.  Heads are
//! parsed, bodies read and answers written there, without the GIL.  Complete requests
//! wait in a queue; an eventfd tells Python's event loop that something waits, and
//! Python takes whole batches with `take()` and answers with `respond()`/`respond_many()`
//! or streams with `start()`/`send()`/`end()`.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body::SizeHint;
use hyper::body::HttpBody;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::server::conn::Http;
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response, StatusCode};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Notify};

mod shed;

// ---------------------------------------------------------------------------------
// Shared state between the tokio side and Python
// ---------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Cfg {
    max_head_bytes: usize,
    max_headers: usize,
    max_url_bytes: usize,
    max_body_bytes: usize,
    head_timeout: Duration,
    keep_alive: Duration,
    body_timeout: Duration,
    /// A connection's 429 due less than this after its last one waits until then.
    pace: Duration,
}

struct Item {
    rid: u64,
    method: hyper::Method,
    uri: hyper::Uri,
    headers: HeaderMap,
    body: Bytes,
    client: SocketAddr,
    received: f64,
    /// False: the body did not arrive within the body timeout (the app answers its 408).
    complete: bool,
}

type Hdrs = Vec<(HeaderName, HeaderValue)>;

enum Reply {
    Full(StatusCode, Hdrs, Bytes),
    Stream(StatusCode, Hdrs, mpsc::UnboundedReceiver<Bytes>),
}

enum Pending {
    Waiting(oneshot::Sender<Reply>),
    Streaming(mpsc::UnboundedSender<Bytes>),
}

struct Shared {
    cfg: Cfg,
    queue: Mutex<VecDeque<Item>>,
    gone: Mutex<Vec<u64>>,
    pending: Mutex<HashMap<u64, Pending>>,
    efd: RawFd,
    signaled: AtomicBool,
    next_rid: AtomicU64,
    connections: AtomicUsize,
    accepted: AtomicU64,
    /// Looks at a waiting connection that left it to a less loaded process.
    deferrals: AtomicU64,
    requests: AtomicU64,
    shutdown_rx: watch::Receiver<bool>,
    /// The server's own answers to refused heads, by what they refuse ("fields", "head",
    /// "url", "timeout", "invalid"): given by Python (the one error answer), else built in.
    refusals: HashMap<String, (StatusCode, Hdrs, Bytes)>,
    /// Paths whose POSTs count while their bodies arrive (`arriving`): inference work.
    counted: Vec<String>,
    /// Counted requests whose heads were read and whose bodies still arrive.
    arriving: AtomicUsize,
    /// The API processes' shared connection counters, when several share the listening
    /// socket (server/accept.py); None: this front accepts every connection it sees.
    slots: Option<Slots>,
    /// The overloaded models' refusals written here (shed.rs), by Python's published rule.
    shed: Mutex<shed::Shed>,
    /// Refusals written here in all.
    shed_count: AtomicU64,
}

/// The shared connection counters of server/accept.py (`Slots`, `may_accept`): one signed
/// 64-bit count per API process in a file every process maps. This front writes its own
/// slot (`me`) as its connections come and go, `gone` once it stops accepting, and takes a
/// waiting connection only while it holds at most `slack` more than every other live
/// process, or once the connection has waited `max_defer` for them (looking every
/// `recheck`). The rule's values are accept.py's (`Slots.rule`), given by Python.
struct Slots {
    base: *mut AtomicI64,
    n: usize,
    me: usize,
    gone: i64,
    slack: i64,
    recheck: Duration,
    max_defer: Duration,
    /// False once this process stops accepting: its slot then stays GONE.
    live: Mutex<bool>,
}

// The map is shared memory of aligned 8-byte counters, read and written atomically.
unsafe impl Send for Slots {}
unsafe impl Sync for Slots {}

/// What Python gives for the shared counters (accept.py `Slots.rule`): the file, this
/// process's slot, GONE, SLACK, RECHECK_S, MAX_DEFER_S.
type SlotsRule = (String, usize, i64, i64, f64, f64);

impl Slots {
    fn open(rule: SlotsRule) -> io::Result<Slots> {
        let (path, me, gone, slack, recheck_s, max_defer_s) = rule;
        let secs = |v: f64| Duration::from_secs_f64(if v.is_finite() { v.max(0.0) } else { 0.0 });
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path)?;
        let len = f.metadata()?.len() as usize;
        let n = len / 8;
        if me >= n {
            return Err(io::Error::new(io::ErrorKind::InvalidInput,
                                      format!("slot {} of a file of {} slots", me, n)));
        }
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), n * 8, libc::PROT_READ | libc::PROT_WRITE,
                       libc::MAP_SHARED, f.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Slots { base: p as *mut AtomicI64, n, me, gone, slack, recheck: secs(recheck_s),
                   max_defer: secs(max_defer_s), live: Mutex::new(true) })
    }

    fn slot(&self, i: usize) -> &AtomicI64 {
        unsafe { &*self.base.add(i) }
    }

    fn publish(&self, count: usize) {
        let live = self.live.lock().unwrap();
        if *live {
            self.slot(self.me).store(count as i64, SeqCst);
        }
    }

    fn leave(&self) {
        let mut live = self.live.lock().unwrap();
        *live = false;
        self.slot(self.me).store(self.gone, SeqCst);
    }

    fn may_accept(&self) -> bool {
        let limit = self.slot(self.me).load(SeqCst) - self.slack;
        (0..self.n).all(|i| {
            let c = self.slot(i).load(SeqCst);
            i == self.me || c >= self.gone || c >= limit
        })
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.n * 8);
        }
    }
}

/// A counted request's place in `Shared::arriving` while its body arrives.
struct Arriving(Option<Arc<Shared>>);

impl Drop for Arriving {
    fn drop(&mut self) {
        if let Some(sh) = self.0.take() {
            sh.arriving.fetch_sub(1, SeqCst);
        }
    }
}

impl Shared {
    /// A connection opened (or adopted): counted, and published to the shared slot.
    fn opened(&self) {
        self.accepted.fetch_add(1, SeqCst);
        let n = self.connections.fetch_add(1, SeqCst) + 1;
        if let Some(slots) = &self.slots {
            slots.publish(n);
        }
    }

    fn closed(&self) {
        let n = self.connections.fetch_sub(1, SeqCst) - 1;
        if let Some(slots) = &self.slots {
            slots.publish(n);
        }
    }

    /// Make the eventfd readable, only on the transition from "nothing signalled".
    fn signal(&self) {
        if !self.signaled.swap(true, SeqCst) {
            let one: u64 = 1;
            unsafe {
                libc::write(self.efd, &one as *const u64 as *const libc::c_void, 8);
            }
        }
    }

    /// Reset the eventfd before draining; `resignal` afterwards if something is left.
    /// The eventfd is read before the flag is cleared: cleared first, a `signal` between
    /// the two would write the eventfd, the read would consume it and the flag would stay
    /// set with nothing readable, so that no later `signal` wrote it again (a lost wake-up:
    /// the event loop never took another request; the overload bench hung a server so).
    fn rearm(&self) {
        let mut v: u64 = 0;
        unsafe {
            libc::read(self.efd, &mut v as *mut u64 as *mut libc::c_void, 8);
        }
        self.signaled.store(false, SeqCst);
    }

    fn resignal(&self) {
        let left = !self.queue.lock().unwrap().is_empty() || !self.gone.lock().unwrap().is_empty();
        if left {
            self.signal();
        }
    }

    fn report_gone(&self, rid: u64) {
        self.gone.lock().unwrap().push(rid);
        self.signal();
    }

    /// The answer to a head refused for `what` (status and message: the built-in fallback).
    fn refusal(&self, what: &str, status: u16, msg: &str) -> Answer {
        match self.refusals.get(what) {
            Some((s, h, b)) => Answer::Full(*s, h.clone(), b.clone()),
            None => error_answer(status, msg),
        }
    }

    /// The same answer as bytes on the wire (written on the socket directly).
    fn raw_refusal(&self, what: &str, status: u16, msg: &str) -> Vec<u8> {
        match self.refusals.get(what) {
            Some((s, h, b)) => {
                let mut out = format!("HTTP/1.1 {} {}\r\n", s.as_u16(),
                                      s.canonical_reason().unwrap_or("Error")).into_bytes();
                for (n, v) in h {
                    out.extend_from_slice(n.as_str().as_bytes());
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(v.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(b);
                out
            }
            None => raw_error(status, msg),
        }
    }
}

fn monotonic() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Dropped while the request still waits for Python: the client went away.
struct PendingGuard {
    rid: u64,
    sh: Arc<Shared>,
    armed: bool,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let was_pending = self.sh.pending.lock().unwrap().remove(&self.rid).is_some();
        if !was_pending {
            return; // Python answered already
        }
        // Not taken yet: withdraw it silently; taken: tell Python.
        let mut q = self.sh.queue.lock().unwrap();
        if let Some(pos) = q.iter().position(|it| it.rid == self.rid) {
            q.remove(pos);
            return;
        }
        drop(q);
        self.sh.report_gone(self.rid);
    }
}

// ---------------------------------------------------------------------------------
// Per-connection state: timeouts and hyper's own error answers
// ---------------------------------------------------------------------------------

enum Phase {
    Idle { since: Instant, first: bool },
    Head { since: Instant },
    Busy,
}

struct CS {
    phase: Phase,
    busy: u32,
    expected_heads: u64,
    seen_heads: u64,
    /// The head being read has its request line whole (a head cut off before: a 414).
    line_done: bool,
    /// When this connection's last 429 was written (the pace of the next).
    refused_at: Option<Instant>,
    /// Ends of request heads ("\r\n\r\n") read from the socket, and how much of one the
    /// bytes read last matched (an end split across reads) ...
    ends_read: u64,
    matched: usize,
    /// ... and requests handed to the app: more read than handled means pipelined requests
    /// wait behind the one answered now.
    handled: u64,
}

struct ConnState {
    m: Mutex<CS>,
    notify: Notify,
    sh: Arc<Shared>,
    /// Bytes read from the socket in all.
    read: AtomicU64,
    /// While a body is read: `read` when it began (u64::MAX: no body is being read) ...
    body_from: AtomicU64,
    /// ... and the body's bytes so far: what was read beyond them is framing (chunk sizes,
    /// trailers), bounded like a head.
    body_got: AtomicU64,
}

enum Expired {
    No,
    Idle,
    Head,
}

impl ConnState {
    fn new(sh: Arc<Shared>) -> Self {
        ConnState {
            m: Mutex::new(CS {
                phase: Phase::Idle { since: Instant::now(), first: true },
                busy: 0,
                expected_heads: 0,
                seen_heads: 0,
                line_done: false,
                refused_at: None,
                ends_read: 0,
                matched: 0,
                handled: 0,
            }),
            notify: Notify::new(),
            sh,
            read: AtomicU64::new(0),
            body_from: AtomicU64::new(u64::MAX),
            body_got: AtomicU64::new(0),
        }
    }

    /// `data` was read; false when a body's framing has gone past its bound.
    fn on_read(&self, data: &[u8]) -> bool {
        let read = self.read.fetch_add(data.len() as u64, SeqCst) + data.len() as u64;
        let mut s = self.m.lock().unwrap();
        if let Phase::Idle { first, .. } = s.phase {
            s.phase = Phase::Head { since: Instant::now() };
            s.line_done = false;
            if first {
                self.notify.notify_one();  // (a connection given a grace at shutdown)
            }
        }
        if !s.line_done && data.contains(&b'\n') {
            s.line_done = true;
        }
        // count the ends of heads (a body holding "\r\n\r\n" counts too: then a drain's
        // close waits for the connection's idle close instead)
        const END: &[u8; 4] = b"\r\n\r\n";
        let mut matched = s.matched;
        for &byte in data {
            matched = if byte == END[matched] {
                matched + 1
            } else if byte == b'\r' {
                1
            } else {
                0
            };
            if matched == END.len() {
                s.ends_read += 1;
                matched = 0;
            }
        }
        s.matched = matched;
        drop(s);
        let from = self.body_from.load(SeqCst);
        if from == u64::MAX {
            return true;
        }
        let got = self.body_got.load(SeqCst);
        let framing = read.saturating_sub(from).saturating_sub(got);
        let bound = 2 * head_buf(&self.sh.cfg) as u64 + 8 * got;
        framing <= bound
    }

    /// The pause before a 429 is written: none for a connection's first, else up to the
    /// pace after its last.
    fn pace(&self, cfg: &Cfg) -> Duration {
        let now = Instant::now();
        let mut s = self.m.lock().unwrap();
        let due = match s.refused_at {
            Some(last) if now < last + cfg.pace => last + cfg.pace,
            _ => now,
        };
        s.refused_at = Some(due);
        due - now
    }

    fn enter(&self) {
        let mut s = self.m.lock().unwrap();
        s.busy += 1;
        s.handled += 1;
        s.phase = Phase::Busy;
    }

    /// Whether requests already read wait behind those handed to the app (pipelined).
    fn pipelined(&self) -> bool {
        let s = self.m.lock().unwrap();
        s.ends_read > s.handled
    }

    /// A connection that has not sent a byte yet.
    fn fresh(&self) -> bool {
        matches!(self.m.lock().unwrap().phase, Phase::Idle { first: true, .. })
    }

    fn leave(&self) {
        let mut s = self.m.lock().unwrap();
        s.busy = s.busy.saturating_sub(1);
        if s.busy == 0 {
            s.phase = Phase::Idle { since: Instant::now(), first: false };
            drop(s);
            self.notify.notify_one();
        }
    }

    fn expect_head(&self) {
        self.m.lock().unwrap().expected_heads += 1;
    }

    fn deadline(&self, cfg: &Cfg) -> Instant {
        let s = self.m.lock().unwrap();
        match s.phase {
            Phase::Idle { since, first: true } => since + cfg.head_timeout,
            Phase::Idle { since, first: false } => since + cfg.keep_alive,
            Phase::Head { since } => since + cfg.head_timeout,
            Phase::Busy => Instant::now() + Duration::from_secs(3600),
        }
    }

    fn expired(&self, cfg: &Cfg) -> Expired {
        let now = Instant::now();
        let s = self.m.lock().unwrap();
        match s.phase {
            Phase::Idle { since, first: true } => {
                // a new connection whose first request never came: its 408, as a head's
                if now >= since + cfg.head_timeout {
                    Expired::Head
                } else {
                    Expired::No
                }
            }
            Phase::Idle { since, first: false } => {
                if now >= since + cfg.keep_alive {
                    Expired::Idle
                } else {
                    Expired::No
                }
            }
            Phase::Head { since } => {
                if now >= since + cfg.head_timeout {
                    Expired::Head
                } else {
                    Expired::No
                }
            }
            Phase::Busy => Expired::No,
        }
    }

    /// Called with the start of every write.  hyper answers bad heads on its own
    /// (400/414/431 with an empty body); such a write comes when no response of ours is
    /// due.  Returns the JSON answer that replaces it.
    fn intercept(&self, first: &[u8]) -> Option<Vec<u8>> {
        if !first.starts_with(b"HTTP/1.") {
            return None;
        }
        let mut s = self.m.lock().unwrap();
        if s.expected_heads > s.seen_heads {
            s.seen_heads += 1;
            return None;
        }
        if s.busy != 0 {
            return None;
        }
        let (what, status, msg) = if first.starts_with(b"HTTP/1.1 431 Request Header Fields Too Large\r\n") {
            if s.line_done {
                ("head", 431u16, "request header fields too large")
            } else {  // the request line never ended: its target is what is too long
                ("url", 414, "request URI too long")
            }
        } else if first.starts_with(b"HTTP/1.1 414 URI Too Long\r\n") {
            ("url", 414, "request URI too long")
        } else if first.starts_with(b"HTTP/1.1 400 Bad Request\r\n") {
            ("invalid", 400, "bad request")
        } else {
            return None;
        };
        drop(s);
        Some(self.sh.raw_refusal(what, status, msg))
    }
}

/// hyper's read buffer: a head within the limit always fits (what is over it is answered
/// by the checks of `handle_inner`, or hyper's own 431 once the buffer is full).
fn head_buf(cfg: &Cfg) -> usize {
    std::cmp::max(8192, cfg.max_head_bytes + 4096)
}

/// At shutdown, how long a connection that has sent nothing yet is given for its first
/// request (web/http_protocol.py FIRST_REQUEST_GRACE_S).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

fn error_json(status: u16, msg: &str) -> String {
    format!("{{\"error\": \"{}\", \"status\": {}}}", msg, status)
}

fn raw_error(status: u16, msg: &str) -> Vec<u8> {
    let body = error_json(status, msg);
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
        status,
        reason,
        body.len(),
        body
    )
    .into_bytes()
}

/// The connection's socket, watched for reads (timeouts) and for hyper's own answers.
struct Io {
    inner: TcpStream,
    st: Arc<ConnState>,
    repl: Option<(Vec<u8>, usize)>,
}

impl Io {
    fn drive_repl(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some((buf, off)) = self.repl.as_mut() {
            while *off < buf.len() {
                match Pin::new(&mut self.inner).poll_write(cx, &buf[*off..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => *off += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            if buf.filled().len() > before && !this.st.on_read(&buf.filled()[before..]) {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData, "body framing or trailers over the limit")));
            }
        }
        r
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.repl.is_none() {
            if let Some(r) = this.st.intercept(buf) {
                this.repl = Some((r, 0));
            }
        }
        if this.repl.is_some() {
            // hyper's own answer: ours is written instead, hyper's is swallowed.
            return match this.drive_repl(cx) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(buf.len())),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            };
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.repl.is_none() {
            if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
                if let Some(r) = this.st.intercept(first) {
                    this.repl = Some((r, 0));
                }
            }
        }
        if this.repl.is_some() {
            let total: usize = bufs.iter().map(|b| b.len()).sum();
            return match this.drive_repl(cx) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(total)),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            };
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.drive_repl(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.drive_repl(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------
// Response bodies
// ---------------------------------------------------------------------------------

/// Marks the connection idle again once hyper has finished with (dropped) the body.
struct BusyGuard(Arc<ConnState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// A stream dropped before `end()`: the client went away.
struct StreamGuard {
    rid: u64,
    sh: Arc<Shared>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let removed = self.sh.pending.lock().unwrap().remove(&self.rid);
        if let Some(Pending::Streaming(_)) = removed {
            self.sh.report_gone(self.rid);
        }
    }
}

enum Kind {
    Full(Option<Bytes>),
    Stream(mpsc::UnboundedReceiver<Bytes>, StreamGuard),
}

struct OutBody {
    kind: Kind,
    _busy: BusyGuard,
}

impl HttpBody for OutBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_data(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Infallible>>> {
        match &mut self.get_mut().kind {
            Kind::Full(b) => Poll::Ready(b.take().map(Ok)),
            Kind::Stream(rx, _) => loop {
                match rx.poll_recv(cx) {
                    // an empty chunk would end a chunked body: skip it
                    Poll::Ready(Some(b)) if b.is_empty() => continue,
                    Poll::Ready(Some(b)) => return Poll::Ready(Some(Ok(b))),
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Pending => return Poll::Pending,
                }
            },
        }
    }

    fn poll_trailers(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<Option<HeaderMap>, Infallible>> {
        Poll::Ready(Ok(None))
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(None) => true,
            Kind::Full(Some(b)) => b.is_empty(),
            Kind::Stream(..) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Stream(..) => SizeHint::default(),
        }
    }
}

// ---------------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------------

enum Answer {
    Full(StatusCode, Hdrs, Bytes),
    Stream(StatusCode, Hdrs, mpsc::UnboundedReceiver<Bytes>, u64),
}

fn error_answer(status: u16, msg: &str) -> Answer {
    let body = error_json(status, msg);
    Answer::Full(
        StatusCode::from_u16(status).unwrap(),
        vec![
            (CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (CONNECTION, HeaderValue::from_static("close")),
        ],
        Bytes::from(body),
    )
}

enum BodyErr {
    /// Over the limit: the first `max + 1` bytes (the app answers its 413 from them).
    TooLarge(Bytes),
    Io,
}

async fn read_body(mut body: hyper::Body, max: usize, st: &ConnState) -> Result<Bytes, BodyErr> {
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(chunk) = body.data().await {
        let mut c = chunk.map_err(|_| BodyErr::Io)?;
        total += c.len();
        st.body_got.store(total as u64, SeqCst);
        let over = total > max;
        if over {
            c.truncate(c.len() - (total - max - 1));  // keep max + 1 bytes in all
        }
        match (&mut first, &mut rest) {
            (None, _) => first = Some(c),
            (Some(f), None) => {
                let mut m = BytesMut::with_capacity(f.len() + c.len());
                m.extend_from_slice(f);
                m.extend_from_slice(&c);
                rest = Some(m);
            }
            (Some(_), Some(m)) => m.extend_from_slice(&c),
        }
        if over {
            let kept = match rest.take() {
                Some(m) => m.freeze(),
                None => first.take().unwrap_or_else(Bytes::new),
            };
            return Err(BodyErr::TooLarge(kept));
        }
    }
    Ok(match rest {
        Some(m) => m.freeze(),
        None => first.unwrap_or_else(Bytes::new),
    })
}

async fn handle_inner(req: Request<hyper::Body>, sh: &Arc<Shared>, st: &Arc<ConnState>,
                      peer: SocketAddr) -> Answer {
    let received = monotonic();
    let cfg = sh.cfg;
    let url_len = req.uri().path_and_query().map(|p| p.as_str().len()).unwrap_or(1);
    if url_len > cfg.max_url_bytes {
        return sh.refusal("url", 414, "request URI too long");
    }
    if req.headers().len() > cfg.max_headers {
        return sh.refusal("fields", 431, "too many header fields");
    }
    let head_len: usize = req.method().as_str().len()
        + url_len
        + 12
        + req.headers().iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum::<usize>()
        + 2;
    if head_len > cfg.max_head_bytes {
        return sh.refusal("head", 431, "request header fields too large");
    }
    let announced_over = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|cl| cl.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(false, |n| n > cfg.max_body_bytes as u64);
    let counted = req.method() == hyper::Method::POST
        && sh.counted.iter().any(|p| req.uri().path().starts_with(p.as_str()));
    let arriving = if counted {
        sh.arriving.fetch_add(1, SeqCst);
        Arriving(Some(sh.clone()))
    } else {
        Arriving(None)
    };
    let (parts, body) = req.into_parts();
    if announced_over {
        // The app answers it at once (its 413 by the announced length, its error shape,
        // request id, metrics and access log: as on the uvicorn front) while the body is
        // read and dropped here, so that the connection stays usable; the rest of a body
        // answered early must come within the head timeout, else the connection closes.
        let most = (cfg.max_body_bytes.saturating_mul(16)).max(16 << 20);
        let head_timeout = cfg.head_timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(head_timeout, drop_body(body, most)).await;
        });
        drop(arriving);  // (counted by the app from now on)
        return hand_over(sh, parts, Bytes::new(), peer, received, true).await;
    }
    let st = st.clone();
    st.body_got.store(0, SeqCst);
    st.body_from.store(st.read.load(SeqCst), SeqCst);
    let read = tokio::time::timeout(cfg.body_timeout, read_body(body, cfg.max_body_bytes, &st)).await;
    st.body_from.store(u64::MAX, SeqCst);
    let body = match read {
        // the app answers its 408 (its shape, request id, metrics, access log); the rest of
        // the body is never read: the connection closes after it
        Err(_) => {
            drop(arriving);
            return hand_over(sh, parts, Bytes::new(), peer, received, false).await;
        }
        // a body over the limit without a length announced: the app answers its 413 from
        // the first max + 1 bytes; the rest is never read, so the connection then closes
        Ok(Err(BodyErr::TooLarge(kept))) => kept,
        Ok(Err(BodyErr::Io)) => return error_answer(400, "bad request body"),
        Ok(Ok(b)) => {
            let now = monotonic();
            if let Some((s, h, b, first)) = shed::refusal(
                    &sh.shed, &parts.method, parts.uri.path(), &parts.headers, received, now) {
                sh.shed_count.fetch_add(1, SeqCst);
                if first {  // Python counts it on its next turn: one within COUNT_WITHIN
                    let sh = sh.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(shed::COUNT_WITHIN).await;
                        sh.signal();
                    });
                }
                return Answer::Full(s, h, b);
            }
            b
        }
    };
    drop(arriving);
    hand_over(sh, parts, body, peer, received, true).await
}

/// Read a body to its end without keeping it; false past `most` bytes or on an error.
async fn drop_body(mut body: hyper::Body, most: usize) -> bool {
    let mut total = 0usize;
    while let Some(chunk) = body.data().await {
        match chunk {
            Ok(c) => {
                total += c.len();
                if total > most {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    true
}

/// Queue a whole request for Python and wait for its answer.
async fn hand_over(
    sh: &Arc<Shared>,
    parts: hyper::http::request::Parts,
    body: Bytes,
    peer: SocketAddr,
    received: f64,
    complete: bool,
) -> Answer {
    let rid = sh.next_rid.fetch_add(1, SeqCst);
    let (tx, rx) = oneshot::channel();
    sh.pending.lock().unwrap().insert(rid, Pending::Waiting(tx));
    let mut guard = PendingGuard { rid, sh: sh.clone(), armed: true };
    sh.queue.lock().unwrap().push_back(Item {
        rid,
        method: parts.method,
        uri: parts.uri,
        headers: parts.headers,
        body,
        client: peer,
        received,
        complete,
    });
    sh.requests.fetch_add(1, SeqCst);
    sh.signal();
    let reply = rx.await;
    guard.armed = false;
    match reply {
        Ok(Reply::Full(s, h, b)) => Answer::Full(s, h, b),
        Ok(Reply::Stream(s, h, r)) => Answer::Stream(s, h, r, rid),
        Err(_) => error_answer(503, "server shutting down"),
    }
}

async fn handle(
    req: Request<hyper::Body>,
    sh: Arc<Shared>,
    st: Arc<ConnState>,
    peer: SocketAddr,
) -> Result<Response<OutBody>, Infallible> {
    st.enter();
    let busy = BusyGuard(st.clone());
    let answer = handle_inner(req, &sh, &st, peer).await;
    let status = match &answer {
        Answer::Full(s, _, _) | Answer::Stream(s, _, _, _) => *s,
    };
    if status == StatusCode::TOO_MANY_REQUESTS && !sh.cfg.pace.is_zero() {
        // resent at once after a refusal: answered at the pace, or at once when the server
        // stops (what else the client sends waits behind it, as pipelined requests do)
        let wait = st.pace(&sh.cfg);
        let mut stop = sh.shutdown_rx.clone();
        if !wait.is_zero() && !*stop.borrow() {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
    }
    let (status, mut hdrs, kind) = match answer {
        Answer::Full(s, h, b) => (s, h, Kind::Full(Some(b))),
        Answer::Stream(s, h, r, rid) => (s, h, Kind::Stream(r, StreamGuard { rid, sh: sh.clone() })),
    };
    if *sh.shutdown_rx.borrow() == false && st.pipelined() && status.as_u16() < 400 {
        // a drain's close (the app's `Connection: close` while draining) waits for the
        // requests the client has already sent on this connection: the last one closes it
        hdrs.retain(|(n, v)| !(n == CONNECTION && v.as_bytes().eq_ignore_ascii_case(b"close")));
    }
    let mut resp = Response::new(OutBody { kind, _busy: busy });
    *resp.status_mut() = status;
    let hm = resp.headers_mut();
    for (n, v) in hdrs {
        hm.append(n, v);
    }
    st.expect_head();
    Ok(resp)
}

fn send_raw(fd: RawFd, data: &[u8]) {
    unsafe {
        libc::send(
            fd,
            data.as_ptr() as *const libc::c_void,
            data.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        );
    }
}

struct ConnCount(Arc<Shared>);

impl Drop for ConnCount {
    fn drop(&mut self) {
        self.0.closed();
    }
}

async fn serve_conn(stream: TcpStream, peer: SocketAddr, sh: Arc<Shared>) {
    let _count = ConnCount(sh.clone());
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    let st = Arc::new(ConnState::new(sh.clone()));
    let io = Io { inner: stream, st: st.clone(), repl: None };
    let mut http = Http::new();
    http.http1_only(true);
    http.http1_keep_alive(true);
    http.max_buf_size(head_buf(&sh.cfg));
    let (sh2, st2) = (sh.clone(), st.clone());
    let svc = service_fn(move |req| handle(req, sh2.clone(), st2.clone(), peer));
    let conn = http.serve_connection(io, svc);
    tokio::pin!(conn);
    let mut shut_rx = sh.shutdown_rx.clone();
    let mut shutting = *shut_rx.borrow();
    // a connection that has sent nothing yet when the server stops gets FIRST_REQUEST_GRACE
    // for its first request (its client connected to send one), then closes
    let mut grace: Option<Instant> = None;
    if shutting {
        grace = Some(Instant::now() + FIRST_REQUEST_GRACE);
    }
    loop {
        if let Some(until) = grace {
            let fresh = st.fresh();
            if fresh && Instant::now() >= until {
                break;  // nothing came: closed (hyper would wait for a first request)
            }
            if !fresh {
                grace = None;
                conn.as_mut().graceful_shutdown();
            }
        }
        let mut dl = st.deadline(&sh.cfg);
        if let Some(until) = grace {
            dl = dl.min(until);
        }
        let dl = tokio::time::Instant::from_std(dl);
        tokio::select! {
            _ = &mut conn => break,
            _ = shut_rx.changed(), if !shutting => {
                shutting = true;
                if st.fresh() {
                    grace = Some(Instant::now() + FIRST_REQUEST_GRACE);
                } else {
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = st.notify.notified() => {}
            _ = tokio::time::sleep_until(dl) => {
                match st.expired(&sh.cfg) {
                    Expired::No => {}
                    Expired::Idle => break,
                    Expired::Head => {
                        send_raw(fd, &sh.raw_refusal("timeout", 408, "request head timeout"));
                        break;
                    }
                }
            }
        }
    }
}

/// Accepts connections on the listening socket, each served by `serve_conn`; with shared
/// counters (`Shared::slots`), only while this process is among the least loaded, or once a
/// connection has waited `max_defer` for the others (looked at every `recheck`).
async fn accept_loop(listener: std::net::TcpListener, sh: Arc<Shared>,
                     mut stop: watch::Receiver<bool>) {
    let listener = match AsyncFd::new(listener) {
        Ok(l) => l,
        Err(_) => return,
    };
    if let Some(slots) = &sh.slots {  // live from now on (then as connections come and go)
        slots.publish(sh.connections.load(SeqCst));
    }
    let mut waiting_since: Option<Instant> = None;
    while !*stop.borrow() {
        let mut guard = tokio::select! {
            g = listener.readable() => match g {
                Ok(g) => g,
                Err(_) => return,
            },
            r = stop.changed() => match r {
                Ok(()) => continue,
                Err(_) => return,  // the front is gone
            },
        };
        if let Some(slots) = &sh.slots {
            if !slots.may_accept() {
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() < slots.max_defer {
                    // leave it to a less loaded process; readiness stays set, so the
                    // next `readable` returns at once and looks again
                    sh.deferrals.fetch_add(1, SeqCst);
                    drop(guard);
                    tokio::select! {
                        _ = tokio::time::sleep(slots.recheck) => {}
                        r = stop.changed() => if r.is_err() { return },
                    }
                    continue;
                }
            }
        }
        match guard.try_io(|l| l.get_ref().accept()) {
            Ok(Ok((s, peer))) => {
                waiting_since = None;
                if s.set_nonblocking(true).is_err() {
                    continue;
                }
                if let Ok(stream) = TcpStream::from_std(s) {
                    sh.opened();
                    tokio::spawn(serve_conn(stream, peer, sh.clone()));
                }
            }
            Ok(Err(_)) => {
                // EMFILE and the like: back off a little
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => waiting_since = None,  // none waits (another process took it)
        }
    }
}

// ---------------------------------------------------------------------------------
// Python API
// ---------------------------------------------------------------------------------

type Outgoing = Vec<(oneshot::Sender<Reply>, Reply)>;

/// Hands a call's answers to their connections from inside the runtime: one wake-up of the
/// runtime per call (each oneshot send from outside it wrote the runtime's eventfd: 70% of
/// `respond_many` under load, with the GIL held).
async fn dispatch(mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    while let Some(batch) = rx.recv().await {
        for (tx, reply) in batch {
            let _ = tx.send(reply);
        }
    }
}

#[pyclass(module = "seqserve.service.server._front")]
struct Front {
    sh: Arc<Shared>,
    outbox: mpsc::UnboundedSender<Outgoing>,
    handle: tokio::runtime::Handle,
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    stop_accept: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
}

fn to_headers(raw: Vec<(&[u8], &[u8])>) -> PyResult<Hdrs> {
    let mut out = Vec::with_capacity(raw.len());
    for (n, v) in raw {
        let name = HeaderName::from_bytes(n).map_err(|_| PyValueError::new_err("invalid header name"))?;
        let value = HeaderValue::from_bytes(v).map_err(|_| PyValueError::new_err("invalid header value"))?;
        out.push((name, value));
    }
    Ok(out)
}

fn to_status(s: u16) -> PyResult<StatusCode> {
    StatusCode::from_u16(s).map_err(|_| PyValueError::new_err("invalid status code"))
}

impl Front {
    /// Stop accepting; the shared slot reads GONE from now on (the others take what comes).
    fn stop_accepting(&self) {
        self.stop_accept.send_replace(true);
        if let Some(slots) = &self.sh.slots {
            slots.leave();
        }
    }

    fn deliver(&self, rid: u64, reply: Reply) -> bool {
        let p = self.sh.pending.lock().unwrap().remove(&rid);
        match p {
            Some(Pending::Waiting(tx)) => tx.send(reply).is_ok(),
            Some(other) => {
                // already streaming: put it back, refuse
                self.sh.pending.lock().unwrap().insert(rid, other);
                false
            }
            None => false,
        }
    }
}

#[pymethods]
impl Front {
    #[new]
    #[args(
        fd,
        "*",
        threads = "1",
        max_head_bytes = "16384",
        max_headers = "100",
        max_url_bytes = "8192",
        max_body_bytes = "8 << 20",
        head_timeout_s = "10.0",
        keep_alive_s = "5.0",
        body_timeout_s = "30.0",
        pace_s = "0.0",
        refusals = "None",
        counted = "Vec::new()",
        slots = "None"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        fd: i32,
        threads: usize,
        max_head_bytes: usize,
        max_headers: usize,
        max_url_bytes: usize,
        max_body_bytes: usize,
        head_timeout_s: f64,
        keep_alive_s: f64,
        body_timeout_s: f64,
        pace_s: f64,
        refusals: Option<HashMap<String, (u16, Vec<(&[u8], &[u8])>, &[u8])>>,
        counted: Vec<String>,
        slots: Option<SlotsRule>,
    ) -> PyResult<Self> {
        let secs = |v: f64, name: &str| -> PyResult<Duration> {
            if !(v > 0.0) || !v.is_finite() {
                return Err(PyValueError::new_err(format!("{} must be a positive number", name)));
            }
            Ok(Duration::from_secs_f64(v))
        };
        let cfg = Cfg {
            max_head_bytes,
            max_headers,
            max_url_bytes,
            max_body_bytes,
            head_timeout: secs(head_timeout_s, "head_timeout_s")?,
            keep_alive: secs(keep_alive_s, "keep_alive_s")?,
            body_timeout: secs(body_timeout_s, "body_timeout_s")?,
            pace: if pace_s > 0.0 && pace_s.is_finite() {
                Duration::from_secs_f64(pace_s)
            } else {
                Duration::ZERO
            },
        };
        let mut answers = HashMap::new();
        for (what, (status, headers, body)) in refusals.unwrap_or_default() {
            answers.insert(what, (to_status(status)?, to_headers(headers)?,
                                  Bytes::copy_from_slice(body)));
        }
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(PyOSError::new_err(format!("eventfd: {}", io::Error::last_os_error())));
        }
        let fail = |msg: String| {
            unsafe { libc::close(efd) };
            PyOSError::new_err(msg)
        };
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            let e = io::Error::last_os_error();
            return Err(fail(format!("dup of listening socket {}: {}", fd, e)));
        }
        let listener = unsafe { std::net::TcpListener::from_raw_fd(dup) };
        listener.set_nonblocking(true).map_err(|e| fail(format!("set_nonblocking: {}", e)))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("seqserve-front")
            .enable_all()
            .build()
            .map_err(|e| fail(format!("tokio runtime: {}", e)))?;
        let slots = match slots {
            None => None,
            Some(rule) => {
                let what = format!("connection slots {} ({})", rule.0, rule.1);
                Some(Slots::open(rule).map_err(|e| fail(format!("{}: {}", what, e)))?)
            }
        };
        let (stop_accept, stop_rx) = watch::channel(false);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let sh = Arc::new(Shared {
            cfg,
            queue: Mutex::new(VecDeque::new()),
            gone: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            efd,
            signaled: AtomicBool::new(false),
            next_rid: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            deferrals: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            shutdown_rx,
            refusals: answers,
            counted,
            arriving: AtomicUsize::new(0),
            slots,
            shed: Mutex::new(shed::Shed::default()),
            shed_count: AtomicU64::new(0),
        });
        rt.spawn(accept_loop(listener, sh.clone(), stop_rx));
        let (outbox, outbox_rx) = mpsc::unbounded_channel();
        rt.spawn(dispatch(outbox_rx));
        let handle = rt.handle().clone();
        Ok(Front { sh, outbox, handle, rt: Mutex::new(Some(rt)), stop_accept, shutdown })
    }

    /// The eventfd to watch for readability (requests or disconnect notices waiting).
    fn fileno(&self) -> i32 {
        self.sh.efd
    }

    /// Up to `max` waiting requests, as
    /// (rid, method, path, query, headers, body, (host, port), received, complete).
    fn take(&self, py: Python<'_>, max: usize) -> PyResult<PyObject> {
        self.sh.rearm();
        let items: Vec<Item> = {
            let mut q = self.sh.queue.lock().unwrap();
            let n = max.min(q.len());
            q.drain(..n).collect()
        };
        self.sh.resignal();
        let list = PyList::empty(py);
        for it in items {
            let hl = PyList::empty(py);
            for (n, v) in it.headers.iter() {
                let pair = PyTuple::new(
                    py,
                    &[PyBytes::new(py, n.as_str().as_bytes()), PyBytes::new(py, v.as_bytes())],
                );
                hl.append(pair)?;
            }
            let path: String = it.uri.path().to_string();
            let query = it.uri.query().unwrap_or("");
            let client = (it.client.ip().to_string(), it.client.port());
            let t: PyObject = (
                it.rid,
                it.method.as_str(),
                path,
                PyBytes::new(py, query.as_bytes()),
                hl,
                PyBytes::new(py, &it.body),
                client,
                it.received,
                it.complete,
            )
                .into_py(py);
            list.append(t)?;
        }
        Ok(list.into())
    }

    /// The whole answer.  False when the connection is already gone.
    fn respond(&self, rid: u64, status: u16, headers: Vec<(&[u8], &[u8])>, body: &[u8]) -> PyResult<bool> {
        let reply = Reply::Full(to_status(status)?, to_headers(headers)?, Bytes::copy_from_slice(body));
        Ok(self.deliver(rid, reply))
    }

    /// Several answers in one call: [(rid, status, headers, body), ...].
    fn respond_many(&self, py: Python<'_>, answers: Vec<(u64, u16, Vec<(&[u8], &[u8])>, &[u8])>) -> PyResult<()> {
        let mut replies = Vec::with_capacity(answers.len());
        for (rid, status, headers, body) in answers {
            replies.push((rid, Reply::Full(to_status(status)?, to_headers(headers)?, Bytes::copy_from_slice(body))));
        }
        py.allow_threads(|| {
            let mut txs: Outgoing = Vec::with_capacity(replies.len());
            {
                let mut p = self.sh.pending.lock().unwrap();
                for (rid, reply) in replies {
                    match p.remove(&rid) {
                        Some(Pending::Waiting(tx)) => txs.push((tx, reply)),
                        Some(other) => {
                            p.insert(rid, other);
                        }
                        None => {}
                    }
                }
            }
            if !txs.is_empty() {
                if let Err(mpsc::error::SendError(batch)) = self.outbox.send(txs) {
                    for (tx, reply) in batch {  // the runtime is stopping: send from here
                        let _ = tx.send(reply);
                    }
                }
            }
        });
        Ok(())
    }

    /// Start a streamed (chunked) answer.  False when the connection is already gone.
    fn start(&self, rid: u64, status: u16, headers: Vec<(&[u8], &[u8])>) -> PyResult<bool> {
        let status = to_status(status)?;
        let hdrs = to_headers(headers)?;
        let mut p = self.sh.pending.lock().unwrap();
        match p.remove(&rid) {
            Some(Pending::Waiting(tx)) => {
                let (stx, srx) = mpsc::unbounded_channel();
                p.insert(rid, Pending::Streaming(stx));
                drop(p);
                if tx.send(Reply::Stream(status, hdrs, srx)).is_err() {
                    self.sh.pending.lock().unwrap().remove(&rid);
                    return Ok(false);
                }
                Ok(true)
            }
            Some(other) => {
                p.insert(rid, other);
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// One piece of a streamed answer.  False when the client has gone.
    fn send(&self, py: Python<'_>, rid: u64, data: &[u8]) -> bool {
        let chunk = Bytes::copy_from_slice(data);
        py.allow_threads(|| {  // the send may wake the runtime (a write to its eventfd)
            let p = self.sh.pending.lock().unwrap();
            match p.get(&rid) {
                Some(Pending::Streaming(tx)) => tx.send(chunk).is_ok(),
                _ => false,
            }
        })
    }

    /// End a streamed answer.
    fn end(&self, rid: u64) {
        let removed = {
            let mut p = self.sh.pending.lock().unwrap();
            match p.get(&rid) {
                Some(Pending::Streaming(_)) => p.remove(&rid),
                _ => None,
            }
        };
        drop(removed);
    }

    /// Request ids whose client disconnected before their answer was written (once each).
    fn gone(&self) -> Vec<u64> {
        self.sh.rearm();
        let g = std::mem::take(&mut *self.sh.gone.lock().unwrap());
        self.sh.resignal();
        g
    }

    /// Serve a connection accepted elsewhere (those waiting in the listen queue when the
    /// server stops listening): the front owns `fd` from now on (the caller detaches its
    /// socket object).
    fn adopt(&self, fd: i32) -> PyResult<()> {
        if fd < 0 {
            return Err(PyValueError::new_err("adopt: not a file descriptor"));
        }
        let std_stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
        let peer = match std_stream.peer_addr() {
            Ok(p) => p,
            Err(_) => return Ok(()),  // the client left already: dropping closes it
        };
        std_stream.set_nonblocking(true).map_err(|e| PyOSError::new_err(format!("adopt: {}", e)))?;
        let stream = {
            let _g = self.handle.enter();
            TcpStream::from_std(std_stream).map_err(|e| PyOSError::new_err(format!("adopt: {}", e)))?
        };
        self.sh.opened();
        self.handle.spawn(serve_conn(stream, peer, self.sh.clone()));
        Ok(())
    }

    /// The routes of the front's own refusals (shed.rs): {path: (target, series, template)},
    /// the error templates [(headers, body)], and the rule's settings (`id_bytes`, `id_max`:
    /// the bytes and the most of them a client's X-Request-Id that is kept may have, the
    /// access log's rule); None: refuse nothing
    /// here from now on. Returns the refusals not counted yet, by the routes they replace
    /// (as `refused`).
    #[args(routes, "*", templates = "Vec::new()", request_timeout_s = "30.0",
           max_queue_wait_s = "1.0", retry_after_s = "1.0", cors = "false",
           max_age_s = "0.25", message = "String::new()", after = "String::new()",
           id_bytes = "Vec::new()", id_max = "0")]
    #[allow(clippy::too_many_arguments)]
    fn shed_routes(&self, routes: Option<HashMap<String, (usize, usize, usize)>>,
                   templates: Vec<(Vec<(&[u8], &[u8])>, String)>, request_timeout_s: f64,
                   max_queue_wait_s: f64, retry_after_s: f64, cors: bool, max_age_s: f64,
                   message: String, after: String, id_bytes: Vec<u8>, id_max: usize)
                   -> PyResult<Vec<(usize, f64)>> {
        let mut made = Vec::with_capacity(templates.len());
        for (headers, body) in templates {
            made.push((to_headers(headers)?, body));
        }
        let mut shed = self.sh.shed.lock().unwrap();
        let counted = std::mem::take(&mut shed.refused);
        let routes = match routes {
            None => {
                shed.rule = None;
                return Ok(counted);
            }
            Some(r) => r,
        };
        let paths = routes.into_iter().map(|(p, (target, series, template))| {
            (p, shed::PathRule { target, series, template })
        }).collect();
        let routes = shed::Routes {
            paths, templates: made, request_timeout_s, max_queue_wait_s, retry_after_s, cors,
            max_age_s, message, after, ids: shed::IdRule::new(&id_bytes, id_max),
        };
        let state = match shed.rule.take() {
            Some((_, state)) => state,
            None => shed::State { waits: Vec::new(), at: 0.0, open: false, log_until: 0.0 },
        };
        shed.rule = Some((routes, state));
        Ok(counted)
    }

    /// This loop turn's state of the front's own refusals: each target's expected wait (-1:
    /// not measured; NaN: not ready), whether it may refuse at all, until when refusals'
    /// access lines are left out.
    fn shed_state(&self, waits: Vec<f64>, open: bool, log_until: f64) {
        if let Some((_, state)) = self.sh.shed.lock().unwrap().rule.as_mut() {
            *state = shed::State { waits, at: monotonic(), open, log_until };
        }
    }

    /// The refusals written here since the last call: [(series, seconds)].
    fn refused(&self) -> Vec<(usize, f64)> {
        std::mem::take(&mut self.sh.shed.lock().unwrap().refused)
    }

    /// Requests to the `counted` paths whose heads were read and whose bodies still
    /// arrive (not yet taken): they count against the server's max in flight.
    fn arriving(&self) -> usize {
        self.sh.arriving.load(SeqCst)
    }

    /// Connections open now.
    fn connections(&self) -> usize {
        self.sh.connections.load(SeqCst)
    }

    /// Stop accepting new connections.
    fn pause(&self) {
        self.stop_accepting();
    }

    /// Stop accepting and close connections as they finish (idle ones at once, those with
    /// a request under way after its answer, fresh ones after their grace), while Python
    /// still takes and answers requests; `close` then stops the runtime.
    fn shutdown(&self) {
        self.stop_accepting();
        self.shutdown.send_replace(true);
    }

    /// Stop accepting, close idle keep-alive connections, let the others finish for up to
    /// `timeout_s` seconds, then stop the runtime.  The GIL is released while waiting.
    #[args(timeout_s = "5.0")]
    fn close(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        self.stop_accepting();
        self.shutdown.send_replace(true);
        let rt = self.rt.lock().unwrap().take();
        let sh = self.sh.clone();
        py.allow_threads(move || {
            let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
            while sh.connections.load(SeqCst) > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if let Some(rt) = rt {
                rt.shutdown_timeout(Duration::from_millis(200));
            }
        });
        // Whatever still waited for Python is dropped with its connection.
        self.sh.pending.lock().unwrap().clear();
        Ok(())
    }

    fn stats(&self, py: Python<'_>) -> PyResult<PyObject> {
        let d = PyDict::new(py);
        d.set_item("connections", self.sh.connections.load(SeqCst))?;
        d.set_item("accepted", self.sh.accepted.load(SeqCst))?;
        d.set_item("deferrals", self.sh.deferrals.load(SeqCst))?;
        d.set_item("shed", self.sh.shed_count.load(SeqCst))?;
        d.set_item("requests", self.sh.requests.load(SeqCst))?;
        d.set_item("waiting", self.sh.queue.lock().unwrap().len())?;
        d.set_item("pending", self.sh.pending.lock().unwrap().len())?;
        d.set_item("gone", self.sh.gone.lock().unwrap().len())?;
        d.set_item("closed", self.rt.lock().unwrap().is_none())?;
        Ok(d.into())
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.lock().unwrap().take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Shared {
    // The last reference goes with the last task: no write can hit a reused fd.
    fn drop(&mut self) {
        unsafe {
            libc::close(self.efd);
        }
    }
}

#[pymodule]
fn _front(_py: Python<'_>, m: &PyModule) -> PyResult<()> {
    m.add_class::<Front>()?;
    Ok(())
}
