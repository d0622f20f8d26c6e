//! A throwaway server that also speaks TLS, with a self-signed certificate made for it.

use std::fs;
use std::path::PathBuf;

use crate::RedisServer;
use crate::port;

/// A [`RedisServer`] with a TLS port beside its plain one, and the certificate that TLS clients
/// must trust (a self-signed certificate for `127.0.0.1` and `localhost`).
#[derive(Debug)]
pub struct TlsRedisServer {
    /// The server; its plain port still works (the harness checks readiness through it).
    pub server: RedisServer,
    tls_port: u16,
    ca: PathBuf,
    _certs: tempfile::TempDir,
}

impl TlsRedisServer {
    /// Start a server with a TLS port and a fresh certificate.
    ///
    /// # Panics
    ///
    /// If the certificate cannot be made or the server does not start (e.g. a `redis-server`
    /// built without TLS).
    pub fn start() -> TlsRedisServer {
        let certs = tempfile::Builder::new()
            .prefix("redsem-tls-")
            .tempdir()
            .expect("a temporary directory for certificates");
        let made = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
        ])
        .expect("a self-signed certificate");
        let cert = certs.path().join("cert.pem");
        let key = certs.path().join("key.pem");
        fs::write(&cert, made.cert.pem()).expect("write the certificate");
        fs::write(&key, made.signing_key.serialize_pem()).expect("write the key");
        let tls_port = port::free_port(false);
        let tls_port_arg = tls_port.to_string();
        let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
        let server = RedisServer::start_with(&[
            "--tls-port",
            &tls_port_arg,
            "--tls-cert-file",
            &cert_arg,
            "--tls-key-file",
            &key_arg,
            "--tls-ca-cert-file",
            &cert_arg,
            "--tls-auth-clients",
            "no",
        ]);
        TlsRedisServer {
            server,
            tls_port,
            ca: cert,
            _certs: certs,
        }
    }

    /// `rediss://127.0.0.1:TLS_PORT/`.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// The PEM file a client must trust to verify the server.
    pub fn ca_cert(&self) -> &std::path::Path {
        &self.ca
    }
}
