//! A TCP proxy that injects faults between a client and a server: cut connections, lost
//! replies, latency, refused connections.
//!
//! Built on std threads and blocking sockets only, so it works the same from sync tests and from
//! any tokio runtime flavour (it never needs the runtime to make progress).

use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::POLL_INTERVAL;

/// How long the proxy waits for the target to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an armed [`FaultProxy::drop_reply_after`] fault waits for the reply before it closes
/// the connection anyway.
const SWALLOW_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `Drop` waits for each thread of the proxy to finish.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// Size of the buffer of one read.
const CHUNK: usize = 16 * 1024;
/// How many bytes of the previous read are kept, so a pattern split across two reads is found.
const CARRY: usize = 256;
/// The longest slice of an added delay, so a closed connection stops sleeping soon.
const DELAY_SLICE: Duration = Duration::from_millis(10);

/// A TCP proxy on a free port of 127.0.0.1 in front of `127.0.0.1:<target port>`, which can cut
/// connections, lose a reply, add latency or refuse service on demand.
///
/// Every connection accepted by the proxy gets its own connection to the target and two
/// forwarding threads. Point a client at [`url`](Self::url) instead of the server's URL, then
/// inject faults from the test:
///
/// * [`cut_all`](Self::cut_all): every connection open now is closed on both sides;
/// * [`drop_reply_after`](Self::drop_reply_after): the next request containing a pattern reaches
///   the server, but its reply is lost and the connection closed ("the command ran but the reply
///   was lost");
/// * [`set_delay`](Self::set_delay): latency added to every forwarded chunk;
/// * [`set_refusing`](Self::set_refusing): the server looks unreachable;
/// * [`refuse_before`](Self::refuse_before): it does so from the next request containing a
///   pattern on, which never reaches the server.
///
/// Dropping the proxy closes its port and every connection, and joins its threads (waiting at
/// most a few seconds for them).
///
/// ```no_run
/// use redsem_test::{FaultProxy, RedisServer};
///
/// let server = RedisServer::start();
/// let proxy = FaultProxy::start(server.port());
/// let mut con = redis::Client::open(proxy.url()).unwrap().get_connection().unwrap();
/// proxy.drop_reply_after(b"INCR");
/// // The server increments the counter, but the client sees the connection close.
/// assert!(redis::cmd("INCR").arg("n").query::<i64>(&mut con).is_err());
/// assert_eq!(proxy.triggered(), 1);
/// ```
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// What the acceptor, the forwarding threads and the handle share.
struct Shared {
    target_port: u16,
    stopping: AtomicBool,
    refusing: AtomicBool,
    /// While set, nothing is forwarded either way (connections stay open).
    frozen: AtomicBool,
    delay_micros: AtomicU64,
    /// The pattern of an armed lost-reply fault.
    armed: Mutex<Option<Vec<u8>>>,
    /// The pattern of an armed outage (see `FaultProxy::refuse_before`).
    outage: Mutex<Option<Vec<u8>>>,
    triggered: AtomicUsize,
    next_id: AtomicU64,
    /// The connections open now, by id.
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Every thread started for a connection; finished ones are pruned on each accept.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// One proxied connection: the client's socket and ours to the target.
struct Conn {
    id: u64,
    client: TcpStream,
    server: TcpStream,
    closed: AtomicBool,
    /// A lost-reply fault fired on this connection: the next reply bytes are swallowed.
    swallowing: AtomicBool,
}

/// Which way a forwarding thread copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

impl FaultProxy {
    /// Start a proxy on a free port of 127.0.0.1 that forwards to `127.0.0.1:target_port`.
    ///
    /// The target need not be up yet: each accepted connection connects to it then, and is
    /// closed at once if the target does not accept.
    ///
    /// # Panics
    ///
    /// If no port can be bound or the acceptor thread cannot be started.
    pub fn start(target_port: u16) -> FaultProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .unwrap_or_else(|e| panic!("FaultProxy: cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("FaultProxy: cannot read the bound address: {e}"))
            .port();
        let shared = Arc::new(Shared {
            target_port,
            stopping: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            delay_micros: AtomicU64::new(0),
            armed: Mutex::new(None),
            outage: Mutex::new(None),
            triggered: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("fault-proxy-{port}"))
                .spawn(move || accept_loop(&listener, &shared))
                .unwrap_or_else(|e| panic!("FaultProxy: cannot start the acceptor thread: {e}"))
        };
        FaultProxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the server the proxy forwards to.
    pub fn target_port(&self) -> u16 {
        self.shared.target_port
    }

    /// The URL of the proxy, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Close every connection open through the proxy now, on both sides: the client reads
    /// EOF (or gets a reset), the server sees its client leave. New connections still work.
    pub fn cut_all(&self) {
        self.shared.cut_all();
    }

    /// Arm a one-shot lost-reply fault.
    ///
    /// The next client data containing `pattern` (searched in each read from the client, together
    /// with the end of the previous read, so a pattern of up to 256 bytes split across two reads
    /// is found too) is forwarded to the server. Then the server's next reply bytes on that
    /// connection are swallowed and the connection is closed on both sides; if no reply comes
    /// within 1 s, the connection is closed anyway. The command has run, but the client sees its
    /// connection drop without an answer.
    ///
    /// Everything the server sends on that connection after the match is lost, including replies
    /// to other requests pipelined on it. Arming again replaces a pattern that has not fired yet.
    /// [`triggered`](Self::triggered) counts the faults carried out.
    pub fn drop_reply_after(&self, pattern: &[u8]) {
        assert!(
            !pattern.is_empty(),
            "FaultProxy::drop_reply_after needs a non-empty pattern"
        );
        *lock(&self.shared.armed) = Some(pattern.to_vec());
    }

    /// Arm a one-shot outage that begins just before a request: the next client data
    /// containing `pattern` (found as for [`drop_reply_after`](Self::drop_reply_after)) is not
    /// forwarded, and from that moment the server looks unreachable, as after
    /// [`set_refusing(true)`](Self::set_refusing): every connection is cut and new ones are
    /// closed at once, until `set_refusing(false)`. The request never reaches the server.
    /// Counted by [`triggered`](Self::triggered) when it fires.
    pub fn refuse_before(&self, pattern: &[u8]) {
        assert!(
            !pattern.is_empty(),
            "FaultProxy::refuse_before needs a non-empty pattern"
        );
        *lock(&self.shared.outage) = Some(pattern.to_vec());
    }

    /// How many armed faults have been carried out: lost replies (their connection closed)
    /// and outages.
    pub fn triggered(&self) -> usize {
        self.shared.triggered.load(Ordering::SeqCst)
    }

    /// Add `delay` of latency to every chunk forwarded, in both directions, from now on
    /// ([`Duration::ZERO`] turns it off). A chunk already waiting keeps its old delay.
    pub fn set_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_micros.store(micros, Ordering::SeqCst);
    }

    /// While `on`, the server looks unreachable: new connections are accepted and closed at once,
    /// and the connections open when it is turned on are cut. Turned off, connections work again.
    pub fn set_refusing(&self, on: bool) {
        self.shared.refusing.store(on, Ordering::SeqCst);
        if on {
            self.shared.cut_all();
        }
    }

    /// While `on`, nothing is forwarded in either direction: connections stay open but go
    /// silent, as for a partitioned or frozen client. Turned off, what waited is forwarded.
    pub fn set_frozen(&self, on: bool) {
        self.shared.frozen.store(on, Ordering::SeqCst);
    }

    /// How many connections are open through the proxy now.
    pub fn connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .field("target_port", &self.shared.target_port)
            .field("connections", &self.connections())
            .field("triggered", &self.triggered())
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the acceptor out of `accept`; it sees `stopping` and drops the listener.
        let own: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let _ = TcpStream::connect_timeout(&own, CONNECT_TIMEOUT);
        if let Some(acceptor) = self.acceptor.take() {
            join_within(acceptor, STOP_TIMEOUT);
        }
        // No connection can be added now; close what is open and wait for the threads.
        self.shared.cut_all();
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        let deadline = Instant::now() + STOP_TIMEOUT;
        for handle in threads {
            join_within(handle, deadline.saturating_duration_since(Instant::now()));
        }
    }
}

impl Shared {
    fn cut_all(&self) {
        let conns: Vec<Arc<Conn>> = lock(&self.conns).drain().map(|(_, conn)| conn).collect();
        for conn in conns {
            conn.close();
        }
    }

    /// Close `conn` and forget it.
    fn close(&self, conn: &Conn) {
        lock(&self.conns).remove(&conn.id);
        conn.close();
    }

    fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_micros.load(Ordering::SeqCst))
    }

    /// Carry out the lost-reply fault of `conn` if it is pending: count it and close.
    fn finish_swallow(&self, conn: &Conn) {
        if conn.swallowing.swap(false, Ordering::SeqCst) {
            self.triggered.fetch_add(1, Ordering::SeqCst);
            self.close(conn);
        }
    }

    /// Start `body` on a named thread and remember it, or return false if it cannot start.
    fn spawn(&self, name: String, body: impl FnOnce() + Send + 'static) -> bool {
        match thread::Builder::new().name(name).spawn(body) {
            Ok(handle) => {
                lock(&self.threads).push(handle);
                true
            }
            Err(_) => false,
        }
    }
}

impl Conn {
    fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            // Errors mean the socket is already shut down, which is what we want.
            let _ = self.client.shutdown(Shutdown::Both);
            let _ = self.server.shutdown(Shutdown::Both);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else {
            // A failed accept (e.g. the peer gave up already) concerns that connection only.
            continue;
        };
        if shared.refusing.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        lock(&shared.threads).retain(|handle| !handle.is_finished());
        if let Err(client) = open(client, shared) {
            let _ = client.shutdown(Shutdown::Both);
        }
    }
}

/// Connect `client` to the target and start its forwarding threads; give `client` back on failure.
fn open(client: TcpStream, shared: &Arc<Shared>) -> Result<(), TcpStream> {
    let target: SocketAddr = ([127, 0, 0, 1], shared.target_port).into();
    let Ok(server) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        return Err(client);
    };
    let (Ok(client_reader), Ok(server_reader)) = (client.try_clone(), server.try_clone()) else {
        let _ = server.shutdown(Shutdown::Both);
        return Err(client);
    };
    for stream in [&client, &server] {
        // Redis traffic is small requests and replies: send each at once.
        let _ = stream.set_nodelay(true);
    }
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let conn = Arc::new(Conn {
        id,
        client,
        server,
        closed: AtomicBool::new(false),
        swallowing: AtomicBool::new(false),
    });
    lock(&shared.conns).insert(id, Arc::clone(&conn));
    for (direction, reader) in [
        (Direction::ToServer, client_reader),
        (Direction::ToClient, server_reader),
    ] {
        let (shared2, conn2) = (Arc::clone(shared), Arc::clone(&conn));
        let name = format!("fault-proxy-conn-{id}");
        if !shared.spawn(name, move || pump(direction, reader, &conn2, &shared2)) {
            shared.close(&conn);
            return Ok(());
        }
    }
    // A stop or a refusal that raced with this connection must not leave it open.
    if shared.stopping.load(Ordering::SeqCst) || shared.refusing.load(Ordering::SeqCst) {
        shared.close(&conn);
    }
    Ok(())
}

/// Copy from `reader` to the other side of `conn` until either side closes, applying faults.
fn pump(direction: Direction, mut reader: TcpStream, conn: &Arc<Conn>, shared: &Arc<Shared>) {
    let mut buf = vec![0; CARRY + CHUNK];
    // `buf[..carried]` holds the end of the previous read, for patterns split across reads.
    let mut carried = 0;
    loop {
        let read = match reader.read(&mut buf[carried..]) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let end = carried + read;
        match direction {
            Direction::ToServer => {
                if take_match(&shared.outage, &buf[..end], carried) {
                    shared.triggered.fetch_add(1, Ordering::SeqCst);
                    shared.refusing.store(true, Ordering::SeqCst);
                    shared.cut_all();
                    break;
                }
                if take_match(&shared.armed, &buf[..end], carried) {
                    // Set before the request is forwarded, so its reply is the one swallowed.
                    conn.swallowing.store(true, Ordering::SeqCst);
                    start_swallow_watchdog(conn, shared);
                }
            }
            Direction::ToClient => {
                if conn.swallowing.load(Ordering::SeqCst) {
                    shared.finish_swallow(conn);
                    break;
                }
            }
        }
        if !sleep_unless_closed(shared.delay(), conn) {
            break;
        }
        while shared.frozen.load(Ordering::SeqCst) {
            if !sleep_unless_closed(POLL_INTERVAL, conn) {
                break;
            }
        }
        if conn.is_closed() {
            break;
        }
        let mut writer = match direction {
            Direction::ToServer => &conn.server,
            Direction::ToClient => &conn.client,
        };
        if writer.write_all(&buf[carried..end]).is_err() {
            break;
        }
        if direction == Direction::ToServer {
            let keep = end.min(CARRY);
            buf.copy_within(end - keep..end, 0);
            carried = keep;
        }
    }
    shared.close(conn);
}

/// Close `conn` after [`SWALLOW_TIMEOUT`] if its reply has not come by then.
fn start_swallow_watchdog(conn: &Arc<Conn>, shared: &Arc<Shared>) {
    let (conn2, shared2) = (Arc::clone(conn), Arc::clone(shared));
    let started = shared.spawn(format!("fault-proxy-watchdog-{}", conn.id), move || {
        let deadline = Instant::now() + SWALLOW_TIMEOUT;
        while Instant::now() < deadline && !conn2.is_closed() {
            thread::sleep(POLL_INTERVAL);
        }
        shared2.finish_swallow(&conn2);
    });
    if !started {
        // Without a watchdog, carry the fault out now: the reply is lost all the same.
        shared.finish_swallow(conn);
    }
}

/// Sleep `delay` in short slices; false if `conn` was closed meanwhile.
fn sleep_unless_closed(delay: Duration, conn: &Conn) -> bool {
    let deadline = Instant::now() + delay;
    loop {
        if conn.is_closed() {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        thread::sleep(left.min(DELAY_SLICE));
    }
}

/// Whether `buf` holds the pattern armed in `slot`; a match disarms it. (A match lying wholly
/// in the first `carried` bytes, kept from the previous read, was seen then: not a new one.)
fn take_match(slot: &Mutex<Option<Vec<u8>>>, buf: &[u8], carried: usize) -> bool {
    let mut armed = lock(slot);
    let found = armed.as_deref().is_some_and(|pattern| {
        let from = carried.saturating_sub(pattern.len() - 1);
        contains(&buf[from..], pattern)
    });
    if found {
        *armed = None;
    }
    found
}

/// Whether `pattern` occurs in `haystack`.
fn contains(haystack: &[u8], pattern: &[u8]) -> bool {
    !pattern.is_empty() && haystack.windows(pattern.len()).any(|w| w == pattern)
}

/// Join `handle` if it finishes within `limit`; otherwise leave it running (detached).
fn join_within(handle: JoinHandle<()>, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return;
        }
        thread::sleep(POLL_INTERVAL);
    }
    let _ = handle.join();
}

/// Lock `mutex`, ignoring poisoning: the proxy's state stays consistent between statements.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_finds_patterns_anywhere() {
        assert!(contains(b"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n", b"INCR"));
        assert!(contains(b"INCR", b"INCR"));
        assert!(!contains(b"INC", b"INCR"));
        assert!(!contains(b"anything", b""));
    }

    #[test]
    fn an_unused_target_port_refuses_through_the_proxy() {
        let free = crate::port::free_port(false);
        let proxy = FaultProxy::start(free);
        let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("set a read timeout");
        let mut byte = [0; 1];
        let read = stream.read(&mut byte);
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "read through a proxy without target: {read:?}"
        );
    }
}
