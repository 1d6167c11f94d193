//! The optional cluster secret: loading it, and the once-per-connection challenge-response
//! that both TCP protocols (master RPC, data plane) run before their first request.
//!
//! The secret never crosses the wire. Each side proves it knows the secret with an
//! HMAC-SHA256 over two fresh random nonces, one chosen by each side, so a recorded
//! handshake cannot be replayed and neither side can be used as an oracle for the other's
//! proof (the two MACs carry different labels, and the server proves only after the client
//! has). Every handshake message is one 32-byte frame:
//!
//! ```text
//!  0               4       5       6               8
//!  +---------------+-------+-------+---------------+
//!  | magic "MCAU"  | ver=1 | step  | reserved = 0  |
//!  +---------------+-------+-------+---------------+
//!  8                                              32
//!  | value (24 bytes): a nonce or a truncated MAC  |
//!  +-----------------------------------------------+
//!
//!  client                                   server
//!    | HELLO      value = nonce_c (random)     |
//!    |---------------------------------------->|
//!    |     CHALLENGE  value = nonce_s (random) |
//!    |<----------------------------------------|
//!    | PROOF      value = mac_c                |
//!    |---------------------------------------->|  checks mac_c in constant time
//!    |    ACCEPT value = mac_s, or REFUSE (0s) |
//!    |<----------------------------------------|  REFUSE: the server closes
//!  client checks mac_s, then sends requests
//!
//!  mac_c = HMAC-SHA256(secret, "mooncake-rs auth v1 client" || nonce_c || nonce_s)[..24]
//!  mac_s = HMAC-SHA256(secret, "mooncake-rs auth v1 server" || nonce_c || nonce_s)[..24]
//! ```
//!
//! The frame is 32 bytes on purpose: it is the size of a data-plane request header, so a
//! data-plane server reads the first frame of a connection exactly as it reads a request
//! header and tells the two apart by the magic (a peer without the secret that sends a
//! request first gets an error response, not a hang). The master reads a 16-byte frame
//! header first and does the same.
//!
//! A narrower door runs the same handshake under a secret derived from the cluster secret
//! and a context ([`Token::derive`]: `HMAC-SHA256(secret, "mooncake-rs auth v1 derive" ||
//! context)`): `mooncake.pg` and EP links name their group in the context, so only peers that
//! know both pass.
//!
//! This module is sans-I/O for the servers ([`ServerHandshake`] turns each received frame
//! into the frame to send back) and offers blocking helpers over `Read + Write` for the
//! clients and the blocking server ([`client_handshake`], [`server_handshake`]).
//!
//! Where the secret comes from (see [`process_token`]): a `--auth_token_file` flag, else the
//! environment (`MC_AUTH_TOKEN` holds the secret itself, `MC_AUTH_TOKEN_FILE` names a file).
//! No secret configured means no handshake: the protocols are byte-for-byte what they were.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Magic of every handshake frame, the bytes `MCAU` on the wire.
pub const MAGIC: [u8; 4] = *b"MCAU";
/// Handshake version.
pub const VERSION: u8 = 1;
/// Size of every handshake frame.
pub const FRAME_BYTES: usize = 32;
/// Bytes of a nonce and of a (truncated) MAC.
pub const VALUE_BYTES: usize = 24;
/// Longest secret accepted (a longer one is almost certainly the wrong file).
pub const TOKEN_MAX_BYTES: usize = 4096;
/// Environment variable holding the secret itself.
pub const ENV_TOKEN: &str = "MC_AUTH_TOKEN";
/// Environment variable naming a file that holds the secret.
pub const ENV_TOKEN_FILE: &str = "MC_AUTH_TOKEN_FILE";

const CLIENT_LABEL: &[u8] = b"mooncake-rs auth v1 client";
const DERIVE_LABEL: &[u8] = b"mooncake-rs auth v1 derive";
const HTTP_LABEL: &[u8] = b"mooncake-rs auth v1 http";
const SERVER_LABEL: &[u8] = b"mooncake-rs auth v1 server";

/// What a handshake frame says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// Client to server: `value` is the client's nonce.
    Hello = 1,
    /// Server to client: `value` is the server's nonce.
    Challenge = 2,
    /// Client to server: `value` is `mac_c`.
    Proof = 3,
    /// Server to client: the proof was good; `value` is `mac_s`.
    Accept = 4,
    /// Server to client: the proof was wrong (or the frame unexpected); `value` is zero and
    /// the server closes the connection.
    Refuse = 5,
}

/// One decoded handshake frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub step: Step,
    pub value: [u8; VALUE_BYTES],
}

/// Why a handshake frame did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("handshake frame needs {FRAME_BYTES} bytes, got {0}")]
    Short(usize),
    #[error("not a handshake frame (magic {0:02x?}, expected \"MCAU\")")]
    BadMagic([u8; 4]),
    #[error("unsupported handshake version {0}, expected {VERSION}")]
    BadVersion(u8),
    #[error("unknown handshake step {0}")]
    BadStep(u8),
    #[error("reserved handshake bytes must be zero, got {0:#06x}")]
    BadReserved(u16),
}

impl Frame {
    pub fn new(step: Step, value: [u8; VALUE_BYTES]) -> Frame {
        Frame { step, value }
    }

    /// The wire bytes.
    pub fn encode(&self) -> [u8; FRAME_BYTES] {
        let mut b = [0u8; FRAME_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.step as u8;
        b[8..].copy_from_slice(&self.value);
        b
    }

    /// Decodes the first [`FRAME_BYTES`] of `b`. Never panics.
    pub fn decode(b: &[u8]) -> Result<Frame, FrameError> {
        let Some(b) = b.first_chunk::<FRAME_BYTES>() else {
            return Err(FrameError::Short(b.len()));
        };
        if !is_handshake(b) {
            return Err(FrameError::BadMagic([b[0], b[1], b[2], b[3]]));
        }
        if b[4] != VERSION {
            return Err(FrameError::BadVersion(b[4]));
        }
        let step = match b[5] {
            1 => Step::Hello,
            2 => Step::Challenge,
            3 => Step::Proof,
            4 => Step::Accept,
            5 => Step::Refuse,
            s => return Err(FrameError::BadStep(s)),
        };
        let reserved = u16::from_le_bytes([b[6], b[7]]);
        if reserved != 0 {
            return Err(FrameError::BadReserved(reserved));
        }
        let mut value = [0u8; VALUE_BYTES];
        value.copy_from_slice(&b[8..]);
        Ok(Frame { step, value })
    }
}

/// True when `b` starts with the handshake magic (so it is not a request of either protocol).
pub fn is_handshake(b: &[u8]) -> bool {
    b.starts_with(&MAGIC)
}

/// The cluster secret. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    secret: Vec<u8>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(<{} bytes, redacted>)", self.secret.len())
    }
}

/// Why a secret could not be loaded or a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The secret is unusable (empty, too long, unreadable file, conflicting settings).
    #[error("cluster secret: {0}")]
    Config(String),
    /// The peer refused our proof: it has a different secret.
    #[error(
        "the peer refused our proof of the cluster secret (is the token the same on both sides?)"
    )]
    Refused,
    /// The peer's proof was wrong: it does not know the secret (an impostor, or a different
    /// secret).
    #[error("the peer could not prove it knows the cluster secret")]
    BadPeerProof,
    /// The peer sent something other than the expected handshake frame.
    #[error("authentication handshake failed: {0}")]
    Protocol(String),
    /// The connection failed during the handshake.
    #[error("authentication handshake failed: {kind:?}: {message}")]
    Io {
        kind: io::ErrorKind,
        message: String,
    },
}

impl AuthError {
    fn io(e: io::Error, during: &str) -> AuthError {
        let message = if e.kind() == io::ErrorKind::UnexpectedEof {
            format!(
                "the peer closed the connection while {during} (does it run without a \
                 cluster secret, or with a different one?)"
            )
        } else {
            format!("{during}: {e}")
        };
        AuthError::Io {
            kind: e.kind(),
            message,
        }
    }
}

impl Token {
    /// A secret from its bytes. Leading and trailing ASCII whitespace (a file's final
    /// newline) is not part of it. Errors: empty or longer than [`TOKEN_MAX_BYTES`].
    pub fn new(bytes: &[u8]) -> Result<Token, AuthError> {
        let secret = bytes.trim_ascii();
        if secret.is_empty() {
            return Err(AuthError::Config("the token is empty".into()));
        }
        if secret.len() > TOKEN_MAX_BYTES {
            return Err(AuthError::Config(format!(
                "the token is {} bytes, more than the {TOKEN_MAX_BYTES} allowed",
                secret.len()
            )));
        }
        Ok(Token {
            secret: secret.to_vec(),
        })
    }

    /// Reads the secret from a file. Errors name the file. A file that group or others may
    /// read works, with a warning: whoever reads it can pass as a member.
    pub fn from_file(path: &Path) -> Result<Token, AuthError> {
        let bytes = std::fs::read(path).map_err(|e| {
            AuthError::Config(format!("cannot read token file {}: {e}", path.display()))
        })?;
        if let Some(why) = loose_mode(path) {
            tracing::warn!("{why}");
        }
        Token::new(&bytes)
            .map_err(|e| AuthError::Config(format!("token file {}: {e}", path.display())))
    }

    /// The secret the environment configures: `MC_AUTH_TOKEN` (the secret) or
    /// `MC_AUTH_TOKEN_FILE` (a file holding it); `None` when neither is set. Setting both is
    /// an error, as is a set but empty variable.
    pub fn from_env() -> Result<Option<Token>, AuthError> {
        let direct = std::env::var_os(ENV_TOKEN);
        let file = std::env::var_os(ENV_TOKEN_FILE);
        match (direct, file) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(AuthError::Config(format!(
                "both {ENV_TOKEN} and {ENV_TOKEN_FILE} are set; set one"
            ))),
            (Some(t), None) => {
                use std::os::unix::ffi::OsStrExt;
                Token::new(t.as_bytes())
                    .map(Some)
                    .map_err(|e| AuthError::Config(format!("{ENV_TOKEN}: {e}")))
            }
            (None, Some(p)) => Token::from_file(&PathBuf::from(p)).map(Some),
        }
    }

    fn mac(&self, label: &[u8], nonce_c: &[u8], nonce_s: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .expect("HMAC takes keys of any length");
        m.update(label);
        m.update(nonce_c);
        m.update(nonce_s);
        m
    }

    fn tag(&self, label: &[u8], nonce_c: &[u8], nonce_s: &[u8]) -> [u8; VALUE_BYTES] {
        let full = self.mac(label, nonce_c, nonce_s).finalize().into_bytes();
        let mut out = [0u8; VALUE_BYTES];
        out.copy_from_slice(&full[..VALUE_BYTES]);
        out
    }

    /// Constant-time check of a truncated MAC.
    fn verify(&self, label: &[u8], nonce_c: &[u8], nonce_s: &[u8], got: &[u8]) -> bool {
        self.mac(label, nonce_c, nonce_s)
            .verify_truncated_left(got)
            .is_ok()
    }
}

impl Token {
    /// The bearer credential of the HTTP endpoints that change state:
    /// `hex(HMAC-SHA256(secret, "mooncake-rs auth v1 http"))`, 64 lowercase hex digits.
    /// Derived rather than the secret itself, so that a request seen on the wire (HTTP is
    /// not encrypted) does not give away the secret of the TCP handshakes.
    pub fn http_bearer(&self) -> String {
        let mac = self.mac(HTTP_LABEL, b"", b"").finalize().into_bytes();
        mac.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether an `Authorization` header value is `Bearer <http_bearer>` (the hex compared
    /// in constant time after decoding).
    pub fn check_authorization(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header else {
            return false;
        };
        let Some(hex) = h.strip_prefix(b"Bearer ") else {
            return false;
        };
        let hex = hex.trim_ascii();
        if hex.len() != 64 {
            return false;
        }
        let mut got = [0u8; 32];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            let (Some(hi), Some(lo)) = (hex_digit(pair[0]), hex_digit(pair[1])) else {
                return false;
            };
            got[i] = hi << 4 | lo;
        }
        self.mac(HTTP_LABEL, b"", b"").verify_slice(&got).is_ok()
    }
}

impl Token {
    /// The secret of one narrower door: `HMAC-SHA256(secret, "mooncake-rs auth v1 derive" ||
    /// context)` (32 bytes), for a handshake that only peers which know both the cluster
    /// secret and `context` pass. `mooncake.pg` and EP bind their links to one group this
    /// way (`context` names the link kind and the group), so a member of another group with
    /// the same secret fails the handshake, and a derived secret seen by one group's members
    /// opens no other door (it is not the cluster secret, nor another context's).
    pub fn derive(&self, context: &[u8]) -> Token {
        Token {
            secret: self
                .mac(DERIVE_LABEL, context, b"")
                .finalize()
                .into_bytes()
                .to_vec(),
        }
    }
}

/// Why the token file at `path` is readable beyond its owner, or `None` when it is not (or its
/// mode cannot be read: reading it just succeeded, so that is not worth a second error).
pub fn loose_mode(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o077 != 0).then(|| {
        format!(
            "token file {} has mode {:o}: group or others can read or change the cluster \
             secret; chmod 600 it",
            path.display(),
            mode & 0o777
        )
    })
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

static PROCESS: OnceLock<Result<Option<&'static Token>, AuthError>> = OnceLock::new();

/// Sets this process's secret from a `--auth_token_file` flag (which wins over the
/// environment); with `None`, from the environment. Call it once at start-up, before any
/// server or client is made; returns what [`process_token`] will return from now on.
/// A second call returns the first call's outcome.
pub fn init_process(flag_file: Option<&Path>) -> Result<Option<&'static Token>, AuthError> {
    PROCESS
        .get_or_init(|| {
            let token = match flag_file {
                Some(p) => Some(Token::from_file(p)?),
                None => Token::from_env()?,
            };
            Ok(token.map(|t| &*Box::leak(Box::new(t))))
        })
        .clone()
}

/// This process's secret: what [`init_process`] set, else the environment's (read once).
/// `Ok(None)`: no secret, no handshake. Entry points call this (or `init_process`) at
/// start-up and fail on an error, so the defaults of server and client settings
/// ([`process_token_or_none`]) agree with what start-up checked.
pub fn process_token() -> Result<Option<&'static Token>, AuthError> {
    init_process(None)
}

/// [`process_token`] for the defaults of server and client settings: `None` when there is
/// no secret *or the setting is broken*. Every entry point (`mooncake_master`,
/// `mooncake_client`, `mooncake_http_metadata_server`, `Store::setup`,
/// `TransferEngine::initialize`) calls [`process_token`] or [`init_process`] first and refuses
/// to start on an error, so a broken setting never gets as far as these defaults there; code
/// that builds servers directly should do the same.
pub fn process_token_or_none() -> Option<&'static Token> {
    process_token().ok().flatten()
}

fn fresh_nonce() -> [u8; VALUE_BYTES] {
    let mut n = [0u8; VALUE_BYTES];
    getrandom::getrandom(&mut n).expect("the OS random source is available");
    n
}

/// The server's side of one handshake, fed one received frame at a time.
#[derive(Debug)]
pub struct ServerHandshake {
    token: Token,
    state: ServerState,
}

#[derive(Debug)]
enum ServerState {
    AwaitHello,
    AwaitProof {
        nonce_c: [u8; VALUE_BYTES],
        nonce_s: [u8; VALUE_BYTES],
    },
    Done,
}

/// What the server does after a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerStep {
    /// Send this frame and read the next one.
    Reply([u8; FRAME_BYTES]),
    /// Send this ACCEPT: the peer is authenticated; requests follow.
    Accept([u8; FRAME_BYTES]),
    /// Send this REFUSE and close: the peer failed.
    Refuse([u8; FRAME_BYTES], AuthError),
    /// The bytes are not a handshake frame (the peer sent a request first): answer in the
    /// protocol's own way that it is refused, and close.
    NotHandshake,
}

fn refuse(why: AuthError) -> ServerStep {
    ServerStep::Refuse(Frame::new(Step::Refuse, [0; VALUE_BYTES]).encode(), why)
}

impl ServerHandshake {
    pub fn new(token: &Token) -> ServerHandshake {
        ServerHandshake {
            token: token.clone(),
            state: ServerState::AwaitHello,
        }
    }

    /// True once the peer is authenticated.
    pub fn is_done(&self) -> bool {
        matches!(self.state, ServerState::Done)
    }

    /// Handles one received 32-byte frame.
    pub fn on_frame(&mut self, bytes: &[u8]) -> ServerStep {
        if !is_handshake(bytes) {
            return ServerStep::NotHandshake;
        }
        let frame = match Frame::decode(bytes) {
            Ok(f) => f,
            Err(e) => return refuse(AuthError::Protocol(e.to_string())),
        };
        match (&self.state, frame.step) {
            (ServerState::AwaitHello, Step::Hello) => {
                let nonce_s = fresh_nonce();
                self.state = ServerState::AwaitProof {
                    nonce_c: frame.value,
                    nonce_s,
                };
                ServerStep::Reply(Frame::new(Step::Challenge, nonce_s).encode())
            }
            (ServerState::AwaitProof { nonce_c, nonce_s }, Step::Proof) => {
                if self
                    .token
                    .verify(CLIENT_LABEL, nonce_c, nonce_s, &frame.value)
                {
                    let mac_s = self.token.tag(SERVER_LABEL, nonce_c, nonce_s);
                    self.state = ServerState::Done;
                    ServerStep::Accept(Frame::new(Step::Accept, mac_s).encode())
                } else {
                    refuse(AuthError::BadPeerProof)
                }
            }
            (_, step) => refuse(AuthError::Protocol(format!(
                "unexpected handshake step {step:?}"
            ))),
        }
    }
}

fn read_frame<S: Read>(s: &mut S, during: &str) -> Result<[u8; FRAME_BYTES], AuthError> {
    let mut b = [0u8; FRAME_BYTES];
    s.read_exact(&mut b).map_err(|e| AuthError::io(e, during))?;
    Ok(b)
}

fn write_frame<S: Write>(s: &mut S, b: &[u8; FRAME_BYTES], during: &str) -> Result<(), AuthError> {
    s.write_all(b)
        .and_then(|()| s.flush())
        .map_err(|e| AuthError::io(e, during))
}

/// Runs the client's side on a fresh connection: proves the secret and checks the
/// server's proof. The caller bounds it with the socket's read/write timeouts.
pub fn client_handshake<S: Read + Write>(s: &mut S, token: &Token) -> Result<(), AuthError> {
    let nonce_c = fresh_nonce();
    write_frame(
        s,
        &Frame::new(Step::Hello, nonce_c).encode(),
        "sending HELLO",
    )?;
    let challenge = read_frame(s, "waiting for CHALLENGE")?;
    let nonce_s = match Frame::decode(&challenge) {
        Ok(Frame {
            step: Step::Challenge,
            value,
        }) => value,
        Ok(Frame {
            step: Step::Refuse, ..
        }) => return Err(AuthError::Refused),
        Ok(f) => {
            return Err(AuthError::Protocol(format!(
                "expected CHALLENGE, got {:?}",
                f.step
            )))
        }
        Err(e) => {
            return Err(AuthError::Protocol(format!(
                "expected CHALLENGE: {e} (does the peer run without a cluster secret?)"
            )))
        }
    };
    let mac_c = token.tag(CLIENT_LABEL, &nonce_c, &nonce_s);
    write_frame(s, &Frame::new(Step::Proof, mac_c).encode(), "sending PROOF")?;
    let verdict = read_frame(s, "waiting for ACCEPT")?;
    match Frame::decode(&verdict) {
        Ok(Frame {
            step: Step::Accept,
            value,
        }) => {
            if token.verify(SERVER_LABEL, &nonce_c, &nonce_s, &value) {
                Ok(())
            } else {
                Err(AuthError::BadPeerProof)
            }
        }
        Ok(Frame {
            step: Step::Refuse, ..
        }) => Err(AuthError::Refused),
        Ok(f) => Err(AuthError::Protocol(format!(
            "expected ACCEPT, got {:?}",
            f.step
        ))),
        Err(e) => Err(AuthError::Protocol(format!("expected ACCEPT: {e}"))),
    }
}

/// How a blocking server's handshake ended when it did not succeed.
#[derive(Debug)]
pub enum ServerRefusal {
    /// The first frame was not a handshake frame; these are its bytes, for the protocol's
    /// own error answer. Nothing was sent.
    NotHandshake([u8; FRAME_BYTES]),
    /// The peer failed (REFUSE already sent) or the connection broke.
    Failed(AuthError),
}

/// Runs the server's side on an accepted connection (bounded by the socket's timeouts).
/// `Ok(())`: the peer proved the secret and got our ACCEPT.
pub fn server_handshake<S: Read + Write>(s: &mut S, token: &Token) -> Result<(), ServerRefusal> {
    let mut hs = ServerHandshake::new(token);
    loop {
        let b = read_frame(s, "waiting for a handshake frame").map_err(ServerRefusal::Failed)?;
        match hs.on_frame(&b) {
            ServerStep::Reply(r) => {
                write_frame(s, &r, "sending CHALLENGE").map_err(ServerRefusal::Failed)?
            }
            ServerStep::Accept(r) => {
                return write_frame(s, &r, "sending ACCEPT").map_err(ServerRefusal::Failed)
            }
            ServerStep::Refuse(r, why) => {
                let _ = write_frame(s, &r, "sending REFUSE");
                return Err(ServerRefusal::Failed(why));
            }
            ServerStep::NotHandshake => return Err(ServerRefusal::NotHandshake(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn leak(s: &str) -> &'static Token {
        Box::leak(Box::new(Token::new(s.as_bytes()).unwrap()))
    }

    fn pair(client: &'static Token, server: &'static Token) -> (Result<(), AuthError>, bool) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || server_handshake(&mut b, server).is_ok());
        let c = client_handshake(&mut a, client);
        drop(a);
        (c, t.join().unwrap())
    }

    #[test]
    fn frame_layout_is_the_documented_one() {
        let b = Frame::new(Step::Proof, [7; VALUE_BYTES]).encode();
        assert_eq!(&b[0..4], b"MCAU");
        assert_eq!(b[4], 1);
        assert_eq!(b[5], 3);
        assert_eq!(&b[6..8], &[0, 0]);
        assert_eq!(&b[8..], &[7; VALUE_BYTES]);
        assert_eq!(Frame::decode(&b).unwrap().step, Step::Proof);
        let mut bad = b;
        bad[6] = 1;
        assert_eq!(Frame::decode(&bad), Err(FrameError::BadReserved(1)));
        bad = b;
        bad[5] = 9;
        assert_eq!(Frame::decode(&bad), Err(FrameError::BadStep(9)));
        bad[4] = 2;
        assert_eq!(Frame::decode(&bad), Err(FrameError::BadVersion(2)));
        assert_eq!(Frame::decode(&b[..31]), Err(FrameError::Short(31)));
        assert!(matches!(
            Frame::decode(b"MCDQ0000000000000000000000000000"),
            Err(FrameError::BadMagic(_))
        ));
    }

    #[test]
    fn same_secret_authenticates_both_ways() {
        let t = leak("s3cret");
        let (c, s) = pair(t, t);
        assert_eq!(c, Ok(()));
        assert!(s);
        // Whitespace around a file's secret is not part of it.
        let (c, s) = pair(leak("s3cret\n"), t);
        assert_eq!(c, Ok(()));
        assert!(s);
    }

    #[test]
    fn wrong_secret_is_refused_and_the_server_says_so() {
        let (c, s) = pair(leak("wrong"), leak("s3cret"));
        assert_eq!(c, Err(AuthError::Refused));
        assert!(!s);
    }

    #[test]
    fn a_derived_secret_binds_the_context() {
        let t = leak("s3cret");
        let (g1, g2) = (t.derive(b"pg\0group-1"), t.derive(b"pg\0group-2"));
        let d = |tok: Token| &*Box::leak(Box::new(tok));
        // Same secret, same context: both sides pass.
        assert_eq!(
            pair(d(t.derive(b"pg\0group-1")), d(g1.clone())),
            (Ok(()), true)
        );
        // Another context (another group, or EP instead of pg) fails both ways, as does the
        // cluster secret itself or the same context under another secret.
        assert_eq!(
            pair(d(g2.clone()), d(g1.clone())),
            (Err(AuthError::Refused), false)
        );
        assert!(!pair(d(g1.clone()), d(t.derive(b"ep\0group-1"))).1);
        assert!(!pair(t, d(g1.clone())).1);
        assert!(!pair(d(leak("other").derive(b"pg\0group-1")), d(g1.clone())).1);
        // The derived secret is neither the cluster secret nor the HTTP bearer's input.
        assert_ne!(&g1, t);
        assert_eq!(g1.secret.len(), 32);
        assert_ne!(g1.http_bearer(), t.http_bearer());
    }

    #[test]
    fn a_server_without_the_secret_cannot_pass_as_one() {
        // An impostor server that accepts any proof but does not know the secret.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; FRAME_BYTES];
            b.read_exact(&mut buf).unwrap();
            b.write_all(&Frame::new(Step::Challenge, [1; VALUE_BYTES]).encode())
                .unwrap();
            b.read_exact(&mut buf).unwrap();
            b.write_all(&Frame::new(Step::Accept, [2; VALUE_BYTES]).encode())
                .unwrap();
        });
        assert_eq!(
            client_handshake(&mut a, leak("s3cret")),
            Err(AuthError::BadPeerProof)
        );
        t.join().unwrap();
    }

    #[test]
    fn proofs_bind_both_nonces_and_the_direction() {
        let t = leak("k");
        let (n1, n2) = ([1u8; VALUE_BYTES], [2u8; VALUE_BYTES]);
        let c = t.tag(CLIENT_LABEL, &n1, &n2);
        assert!(t.verify(CLIENT_LABEL, &n1, &n2, &c));
        assert!(!t.verify(SERVER_LABEL, &n1, &n2, &c));
        assert!(!t.verify(CLIENT_LABEL, &n2, &n1, &c));
        assert!(!leak("k2").verify(CLIENT_LABEL, &n1, &n2, &c));
        // A replayed PROOF meets a fresh server nonce and fails.
        let mut hs = ServerHandshake::new(t);
        let ServerStep::Reply(_) = hs.on_frame(&Frame::new(Step::Hello, n1).encode()) else {
            panic!("expected a challenge")
        };
        assert!(matches!(
            hs.on_frame(&Frame::new(Step::Proof, c).encode()),
            ServerStep::Refuse(_, AuthError::BadPeerProof)
        ));
    }

    #[test]
    fn out_of_order_and_foreign_frames_are_refused() {
        let t = leak("k");
        let mut hs = ServerHandshake::new(t);
        assert!(matches!(
            hs.on_frame(&Frame::new(Step::Proof, [0; VALUE_BYTES]).encode()),
            ServerStep::Refuse(_, AuthError::Protocol(_))
        ));
        let mut hs = ServerHandshake::new(t);
        assert_eq!(hs.on_frame(&[0u8; FRAME_BYTES]), ServerStep::NotHandshake);
        assert_eq!(hs.on_frame(b"MCDQ"), ServerStep::NotHandshake);
        assert!(!hs.is_done());
    }

    #[test]
    fn a_token_file_others_can_read_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("mc-token-mode-{}", std::process::id()));
        std::fs::write(&path, "s3cret\n").unwrap();
        for (mode, loose) in [(0o600, false), (0o400, false), (0o640, true), (0o604, true)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let why = loose_mode(&path);
            assert_eq!(why.is_some(), loose, "mode {mode:o}: {why:?}");
            assert!(Token::from_file(&path).is_ok(), "a loose mode still works");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn http_bearer_is_derived_and_checked() {
        let t = leak("s3cret");
        let b = t.http_bearer();
        assert_eq!(b.len(), 64);
        assert!(!b.contains("s3cret"));
        assert!(t.check_authorization(Some(format!("Bearer {b}").as_bytes())));
        assert!(t.check_authorization(Some(format!("Bearer {}", b.to_uppercase()).as_bytes())));
        assert!(!t.check_authorization(None));
        assert!(!t.check_authorization(Some(b"Bearer s3cret")));
        assert!(!t.check_authorization(Some(b.as_bytes())));
        let other = leak("other").http_bearer();
        assert!(!t.check_authorization(Some(format!("Bearer {other}").as_bytes())));
        let mut broken = format!("Bearer {b}").into_bytes();
        broken[10] = b'z';
        assert!(!t.check_authorization(Some(&broken)));
    }

    #[test]
    fn bad_secrets_are_clear_errors() {
        assert!(matches!(Token::new(b" \n"), Err(AuthError::Config(m)) if m.contains("empty")));
        assert!(Token::new(&vec![b'a'; TOKEN_MAX_BYTES + 1]).is_err());
        let missing = Token::from_file(Path::new("/nonexistent/token")).unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/token"),
            "{missing}"
        );
        assert!(format!("{:?}", leak("hidden")).contains("redacted"));
        assert!(!format!("{:?}", leak("hidden")).contains("hidden"));
    }
}
