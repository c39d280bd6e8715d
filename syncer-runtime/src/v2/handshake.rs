//! go-plugin's handshake, plugin side (pure; unit-tested).
//!
//! go-plugin v1.6.0 (`client.go` `Start`, `server.go` `Serve`): the host starts the plugin
//! with the magic cookie (`VCLUSTER_PLUGIN=vcluster` for vCluster, `pkg/plugin/v2/grpc.go`
//! `HandshakeConfig`), `PLUGIN_PROTOCOL_VERSIONS` (the app protocol versions it speaks) and
//! `PLUGIN_MIN_PORT` / `PLUGIN_MAX_PORT` in the environment; with automatic mTLS it adds
//! `PLUGIN_CLIENT_CERT`, with a socket folder `PLUGIN_UNIX_SOCKET_DIR`. The plugin listens
//! (on Unix a socket in that folder, else in the temporary folder), then prints one line on
//! stdout:
//!
//! ```text
//! CORE-PROTOCOL-VERSION|APP-PROTOCOL-VERSION|NETWORK-TYPE|NETWORK-ADDR|PROTOCOL|SERVER-CERT
//! 1|1|unix|/tmp/plugin123456|grpc|
//! ```
//!
//! (the last field is the base64 server certificate of automatic mTLS, empty here).

use std::path::PathBuf;

use super::contract::{
    APP_PROTOCOL_VERSION, CORE_PROTOCOL_VERSION, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE,
    ProtocolError,
};

/// The environment variables of the handshake, as the host set them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandshakeEnv {
    /// `VCLUSTER_PLUGIN`.
    pub magic_cookie: Option<String>,
    /// `PLUGIN_PROTOCOL_VERSIONS`: comma-separated app protocol versions of the host.
    pub protocol_versions: Option<String>,
    /// `PLUGIN_CLIENT_CERT`: set when the host wants automatic mTLS.
    pub client_cert: Option<String>,
    /// `PLUGIN_UNIX_SOCKET_DIR`: where the socket goes.
    pub unix_socket_dir: Option<String>,
}

impl HandshakeEnv {
    /// The variables of this process's environment.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            magic_cookie: var(MAGIC_COOKIE_KEY),
            protocol_versions: var("PLUGIN_PROTOCOL_VERSIONS"),
            client_cert: var("PLUGIN_CLIENT_CERT"),
            unix_socket_dir: var("PLUGIN_UNIX_SOCKET_DIR"),
        }
    }

    /// Checks that a vCluster started this process and that it asks for nothing this server
    /// cannot do; returns the folder for the socket (`PLUGIN_UNIX_SOCKET_DIR`, else the
    /// temporary folder).
    ///
    /// The app protocol version is not negotiated: like go-plugin's server, the plugin
    /// announces its own version ([`APP_PROTOCOL_VERSION`]) and the host refuses it if it does
    /// not speak it.
    ///
    /// # Errors
    /// [`ProtocolError::NotStartedByVCluster`] without the magic cookie;
    /// [`ProtocolError::Unsupported`] when the host asks for automatic mTLS.
    pub fn check(&self) -> Result<PathBuf, ProtocolError> {
        if self.magic_cookie.as_deref() != Some(MAGIC_COOKIE_VALUE) {
            return Err(ProtocolError::NotStartedByVCluster);
        }
        if self.client_cert.is_some() {
            return Err(ProtocolError::Unsupported {
                what: "automatic mTLS (PLUGIN_CLIENT_CERT is set); vCluster does not ask for it"
                    .into(),
            });
        }
        Ok(self
            .unix_socket_dir
            .as_ref()
            .map_or_else(std::env::temp_dir, PathBuf::from))
    }

    /// Whether the host speaks [`APP_PROTOCOL_VERSION`] (for the log: a host that does not
    /// will refuse the handshake itself). A host that sent no list is an old go-plugin,
    /// which accepts any version.
    pub fn host_speaks_our_version(&self) -> bool {
        self.protocol_versions.as_deref().is_none_or(|list| {
            list.split(',')
                .any(|v| v.trim().parse::<u32>().ok() == Some(APP_PROTOCOL_VERSION))
        })
    }
}

/// The handshake line for a gRPC server listening on `network` (`unix` or `tcp`) at
/// `address`, without the trailing newline.
pub fn handshake_line(network: &str, address: &str) -> String {
    format!("{CORE_PROTOCOL_VERSION}|{APP_PROTOCOL_VERSION}|{network}|{address}|grpc|")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> HandshakeEnv {
        HandshakeEnv {
            magic_cookie: Some("vcluster".into()),
            protocol_versions: Some("1".into()),
            ..HandshakeEnv::default()
        }
    }

    #[test]
    fn line_is_go_plugins_format() {
        // go-plugin's client splits on `|` and wants at least 4 parts: core version 1, the
        // app version vCluster's HandshakeConfig.ProtocolVersion (1), network, address, and
        // `grpc` (vCluster allows only ProtocolGRPC).
        assert_eq!(
            handshake_line("unix", "/tmp/plugin42"),
            "1|1|unix|/tmp/plugin42|grpc|"
        );
    }

    #[test]
    fn cookie_and_mtls_are_checked() {
        assert_eq!(env().check().unwrap(), std::env::temp_dir());
        let dir = HandshakeEnv {
            unix_socket_dir: Some("/run/sock".into()),
            ..env()
        };
        assert_eq!(dir.check().unwrap(), PathBuf::from("/run/sock"));
        for bad in [
            HandshakeEnv::default(),
            HandshakeEnv {
                magic_cookie: Some("other".into()),
                ..env()
            },
        ] {
            assert!(matches!(
                bad.check(),
                Err(ProtocolError::NotStartedByVCluster)
            ));
        }
        let mtls = HandshakeEnv {
            client_cert: Some("PEM".into()),
            ..env()
        };
        assert!(matches!(
            mtls.check(),
            Err(ProtocolError::Unsupported { .. })
        ));
    }

    #[test]
    fn version_list() {
        assert!(env().host_speaks_our_version());
        for (list, speaks) in [("2,1", true), ("2", false), ("x, 1", true)] {
            let e = HandshakeEnv {
                protocol_versions: Some(list.into()),
                ..env()
            };
            assert_eq!(e.host_speaks_our_version(), speaks, "{list}");
        }
        let old = HandshakeEnv {
            protocol_versions: None,
            ..env()
        };
        assert!(old.host_speaks_our_version());
    }
}
