//! Throwaway servers that also speak TLS — one server, or a cluster — with a self-signed
//! certificate made for them.

use std::fs;
use std::path::{Path, PathBuf};

use crate::port;
use crate::{RedisCluster, RedisServer};

/// A fresh self-signed certificate for `127.0.0.1` and `localhost` in a temporary directory,
/// and the `redis-server` arguments that serve TLS on `tls_port` with it (clients are not
/// asked for certificates).
struct Certificate {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

impl Certificate {
    fn make() -> Certificate {
        let dir = tempfile::Builder::new()
            .prefix("redsem-tls-")
            .tempdir()
            .expect("a temporary directory for certificates");
        let made = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
        ])
        .expect("a self-signed certificate");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        fs::write(&cert, made.cert.pem()).expect("write the certificate");
        fs::write(&key, made.signing_key.serialize_pem()).expect("write the key");
        Certificate { dir, cert, key }
    }

    fn server_args(&self, tls_port: u16) -> Vec<String> {
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &self.cert.display().to_string(),
            "--tls-key-file",
            &self.key.display().to_string(),
            "--tls-ca-cert-file",
            &self.cert.display().to_string(),
            "--tls-auth-clients",
            "no",
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

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
        let certificate = Certificate::make();
        let tls_port = port::free_port(false);
        let args = certificate.server_args(tls_port);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = RedisServer::start_with(&args);
        TlsRedisServer {
            server,
            tls_port,
            ca: certificate.cert,
            _certs: certificate.dir,
        }
    }

    /// `rediss://127.0.0.1:TLS_PORT/`.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// The PEM file a client must trust to verify the server.
    pub fn ca_cert(&self) -> &Path {
        &self.ca
    }
}

/// A [`RedisCluster`] whose nodes also serve TLS (`tls-cluster yes`: the cluster bus too), with
/// the certificate that TLS clients must trust. A TLS client is told the nodes' TLS ports
/// (`CLUSTER SLOTS`, `MOVED`), a plain client their plain ports, which still work (the harness
/// checks readiness and joins the nodes through them).
#[derive(Debug)]
pub struct TlsRedisCluster {
    /// The cluster, by its plain ports.
    pub cluster: RedisCluster,
    tls_ports: Vec<u16>,
    ca: PathBuf,
    _certs: tempfile::TempDir,
}

impl TlsRedisCluster {
    /// Start `masters` nodes with TLS ports and one fresh certificate, and join them.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start`], and if the certificate cannot be made.
    pub fn start(masters: usize) -> TlsRedisCluster {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, got {masters}"
        );
        let certificate = Certificate::make();
        let mut tls_ports = Vec::with_capacity(masters);
        let nodes = (0..masters)
            .map(|_| {
                // With --tls-cluster the cluster bus listens on the TLS port + 10000: that one
                // must be free too (a busy one fails every start attempt of the node).
                let tls_port = port::free_port(true);
                tls_ports.push(tls_port);
                let mut args = certificate.server_args(tls_port);
                args.extend(["--tls-cluster".to_owned(), "yes".to_owned()]);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                RedisServer::start_cluster_node_with(&args)
            })
            .collect();
        TlsRedisCluster {
            cluster: RedisCluster::join(nodes),
            tls_ports,
            ca: certificate.cert,
            _certs: certificate.dir,
        }
    }

    /// `rediss+cluster://127.0.0.1:TLS_PORT,...` naming every node by its TLS port.
    pub fn tls_url(&self) -> String {
        let hosts: Vec<String> = self
            .tls_ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("rediss+cluster://{}", hosts.join(","))
    }

    /// The PEM file a client must trust to verify the nodes.
    pub fn ca_cert(&self) -> &Path {
        &self.ca
    }
}
