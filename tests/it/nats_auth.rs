//! Credentials a test generates for a nats-server of its own: an operator
//! with a JetStream account and `.creds` files (JWTs signed with nkeys), and
//! a CA with server and client certificates (rcgen).

pub mod operator {
    //! NATS decentralized-auth ("operator mode") material generated at test time,
    //! without `nsc`: operator / system account / JetStream account / user nkeys,
    //! NATS JWT v2 claims signed by hand, and `.creds` files.
    //!
    //! Crates: `nkeys` 0.4, `serde_json` 1, `sha2` 0.10, `data-encoding` 2, `std`.
    //!
    //! JWT layout (nats-io/jwt v2, `claims.go`):
    //!   base64url_nopad(header) "." base64url_nopad(claims) "." base64url_nopad(ed25519 sig)
    //!   header = {"typ":"JWT","alg":"ed25519-nkey"}
    //!   the signature covers the ASCII bytes of "header_b64.claims_b64", made with the
    //!   issuer's nkey; `iss` is the issuer's public key.
    //!   `jti` = base32 (RFC 4648 alphabet, no padding) of SHA-512/256 over the JSON of the
    //!   generic claim fields (aud, exp, jti="", iat, iss, name, nbf, sub, empty ones omitted).

    use std::path::{Path, PathBuf};
    use std::time::{SystemTime, UNIX_EPOCH};

    use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
    use nkeys::KeyPair;
    use serde_json::{Map, Value, json};
    use sha2::{Digest, Sha512_256};

    /// What a test needs to run nats-server in operator mode.
    #[allow(dead_code)]
    pub struct OperatorMode {
        /// Lines for a nats-server config file: `operator`, `system_account`,
        /// `resolver: MEMORY`, `resolver_preload { .. }`. Add `jetstream { .. }`
        /// and `listen` yourself.
        pub server_config: String,
        /// `.creds` of a user in an account with JetStream enabled (unlimited).
        pub creds_file: PathBuf,
        /// `.creds` of a user signed by an account the server does not know.
        pub wrong_creds_file: PathBuf,
        /// Public key (`A...`) of the JetStream-enabled account.
        pub account_public_key: String,
        /// Public key (`A...`) of the system account.
        pub system_account_public_key: String,
    }

    const JWT_HEADER: &str = r#"{"typ":"JWT","alg":"ed25519-nkey"}"#;

    fn now_unix() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock before 1970")
            .as_secs() as i64
    }

    /// Signs `nats` (the type-specific part of the claims) for `subject`, issued by `issuer`.
    fn encode_jwt(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> String {
        let iat = now_unix();
        let iss = issuer.public_key();

        // jti: hash of ClaimsData with ID = "" (Go field order aud,exp,jti,iat,iss,name,nbf,sub;
        // empty fields are omitted). serde_json's default map is a BTreeMap, i.e. keys sorted,
        // and iat < iss < name < sub is also the Go order, so the bytes match what Go hashes.
        let mut id_src = Map::new();
        id_src.insert("iat".into(), json!(iat));
        id_src.insert("iss".into(), json!(iss));
        if !name.is_empty() {
            id_src.insert("name".into(), json!(name));
        }
        id_src.insert("sub".into(), json!(subject));
        let id_json = serde_json::to_vec(&Value::Object(id_src)).expect("json");
        let jti = BASE32_NOPAD.encode(&Sha512_256::digest(&id_json));

        let claims = json!({
            "jti": jti,
            "iat": iat,
            "iss": iss,
            "name": name,
            "sub": subject,
            "nats": nats,
        });
        let header_b64 = BASE64URL_NOPAD.encode(JWT_HEADER.as_bytes());
        let claims_b64 = BASE64URL_NOPAD.encode(&serde_json::to_vec(&claims).expect("json"));
        let to_sign = format!("{header_b64}.{claims_b64}");
        let sig = issuer.sign(to_sign.as_bytes()).expect("nkey sign");
        format!("{to_sign}.{}", BASE64URL_NOPAD.encode(&sig))
    }

    fn operator_jwt(operator: &KeyPair, system_account: &str) -> String {
        encode_jwt(
            operator,
            &operator.public_key(),
            "test-operator",
            json!({
                "type": "operator",
                "version": 2,
                "system_account": system_account,
            }),
        )
    }

    /// Account JWT signed by the operator. `jetstream` = unlimited JetStream
    /// (mem_storage/disk_storage/streams/consumer = -1); otherwise JetStream off.
    fn account_jwt(operator: &KeyPair, account: &KeyPair, name: &str, jetstream: bool) -> String {
        let mut limits = json!({
            // NatsLimits
            "subs": -1, "data": -1, "payload": -1,
            // AccountLimits
            "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
        });
        if jetstream {
            // JetStreamLimits: 0 means disabled; -1 unlimited.
            let l = limits.as_object_mut().unwrap();
            l.insert("mem_storage".into(), json!(-1));
            l.insert("disk_storage".into(), json!(-1));
            l.insert("streams".into(), json!(-1));
            l.insert("consumer".into(), json!(-1));
        }
        encode_jwt(
            operator,
            &account.public_key(),
            name,
            json!({
                "type": "account",
                "version": 2,
                "limits": limits,
                "default_permissions": { "pub": {}, "sub": {} },
            }),
        )
    }

    /// User JWT signed directly by the account key (so no `issuer_account`).
    fn user_jwt(account: &KeyPair, user: &KeyPair, name: &str) -> String {
        encode_jwt(
            account,
            &user.public_key(),
            name,
            json!({
                "type": "user",
                "version": 2,
                "pub": {},
                "sub": {},
                "subs": -1,
                "data": -1,
                "payload": -1,
            }),
        )
    }

    /// The `.creds` layout of nats-io/jwt `FormatUserConfig`. The trailing newline after
    /// the last `------END ...------` line matters: async-nats' regex requires `\r?\n` there.
    fn creds(jwt: &str, user_seed: &str) -> String {
        format!(
            "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
    ************************* IMPORTANT *************************\n\
    NKEY Seed printed below can be used to sign and prove identity.\n\
    NKEYs are sensitive and should be treated as secrets.\n\n\
    -----BEGIN USER NKEY SEED-----\n{user_seed}\n------END USER NKEY SEED------\n\n\
    *************************************************************\n"
        )
    }

    fn write_private(path: &Path, contents: &str) {
        std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
    }

    /// Generates everything in `dir` (created if missing) and returns the config
    /// snippet and creds paths.
    pub fn operator_mode(dir: &Path) -> OperatorMode {
        std::fs::create_dir_all(dir).expect("create operator dir");

        let operator = KeyPair::new_operator();
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();

        let op_jwt = operator_jwt(&operator, &system.public_key());
        let sys_jwt = account_jwt(&operator, &system, "SYS", false);
        let acc_jwt = account_jwt(&operator, &account, "WEIR", true);
        let usr_jwt = user_jwt(&account, &user, "weir-test-user");

        // A user of an account the operator never signed / the server never loaded.
        let stranger_account = KeyPair::new_account();
        let stranger_user = KeyPair::new_user();
        let stranger_jwt = user_jwt(&stranger_account, &stranger_user, "stranger");

        let creds_file = dir.join("user.creds");
        write_private(&creds_file, &creds(&usr_jwt, &user.seed().expect("seed")));
        let wrong_creds_file = dir.join("wrong-user.creds");
        write_private(
            &wrong_creds_file,
            &creds(&stranger_jwt, &stranger_user.seed().expect("seed")),
        );

        // `operator` accepts an inline JWT or a path; inline keeps it self-contained.
        let server_config = format!(
            "operator: \"{op_jwt}\"\n\
    system_account: {sys}\n\
    resolver: MEMORY\n\
    resolver_preload: {{\n  {sys}: \"{sys_jwt}\"\n  {acc}: \"{acc_jwt}\"\n}}\n",
            sys = system.public_key(),
            acc = account.public_key(),
        );

        OperatorMode {
            server_config,
            creds_file,
            wrong_creds_file,
            account_public_key: account.public_key(),
            system_account_public_key: system.public_key(),
        }
    }
}

pub mod tls {
    //! Test-time PKI for nats-server mutual TLS, generated with `rcgen` 0.14
    //! (`default-features = false, features = ["crypto", "pem", "ring"]`).
    //! Keys are ECDSA P-256 (rcgen's default), written as PKCS#8 `PRIVATE KEY` PEM,
    //! which both nats-server (Go crypto/tls) and async-nats (rustls-pki-types) accept.

    use std::path::{Path, PathBuf};

    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };

    #[allow(dead_code)]
    pub struct TlsFiles {
        pub ca: PathBuf,
        pub server_cert: PathBuf,
        pub server_key: PathBuf,
        pub client_cert: PathBuf,
        pub client_key: PathBuf,
        /// A nats-server `tls { .. }` block requiring client certificates.
        pub server_config: String,
    }

    fn dn(common_name: &str) -> DistinguishedName {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, "weir tests");
        dn
    }

    fn write(path: &Path, contents: &str) {
        std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    fn leaf_params(cn: &str, sans: Vec<String>, eku: ExtendedKeyUsagePurpose) -> CertificateParams {
        let mut p = CertificateParams::new(sans).expect("leaf params");
        p.distinguished_name = dn(cn);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![eku];
        p.use_authority_key_identifier_extension = true;
        p
    }

    /// Generates a CA plus a server certificate (SANs `127.0.0.1`, `localhost`) and a client
    /// certificate, both signed by that CA, as PEM files in `dir` (created if missing).
    pub fn tls_files(dir: &Path) -> TlsFiles {
        std::fs::create_dir_all(dir).expect("create tls dir");

        // CA
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        // Unique CA name per call: two CAs with the same subject DN make rustls report
        // `BadSignature` instead of `UnknownIssuer` for a wrong-CA client.
        let ca_tag: String = ca_key.public_key_raw()[1..7]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        ca_params.distinguished_name = dn(&format!("weir test CA {ca_tag}"));
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca self-sign");
        let issuer = Issuer::new(ca_params, &ca_key);

        // Server: SANs 127.0.0.1 and localhost (IP strings become IP SANs in rcgen).
        let server_key = KeyPair::generate().expect("server key");
        let sp = leaf_params(
            "127.0.0.1",
            vec!["127.0.0.1".to_string(), "localhost".to_string()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let server_cert = sp.signed_by(&server_key, &issuer).expect("server sign");

        // Client
        let client_key = KeyPair::generate().expect("client key");
        let cp = leaf_params(
            "weir-test-client",
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let client_cert = cp.signed_by(&client_key, &issuer).expect("client sign");

        let files = TlsFiles {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server-cert.pem"),
            server_key: dir.join("server-key.pem"),
            client_cert: dir.join("client-cert.pem"),
            client_key: dir.join("client-key.pem"),
            server_config: String::new(),
        };
        write(&files.ca, &ca_cert.pem());
        write(&files.server_cert, &server_cert.pem());
        write(&files.server_key, &server_key.serialize_pem());
        write(&files.client_cert, &client_cert.pem());
        write(&files.client_key, &client_key.serialize_pem());

        // JSON-style quoted strings are valid nats-server config strings (paths may
        // contain characters the unquoted form would choke on).
        let q = |p: &Path| quote(&p.display().to_string());
        let server_config = format!(
            "tls {{\n  cert_file: {}\n  key_file: {}\n  ca_file: {}\n  verify: true\n  timeout: 2\n}}\n",
            q(&files.server_cert),
            q(&files.server_key),
            q(&files.ca),
        );
        TlsFiles {
            server_config,
            ..files
        }
    }

    /// Double-quoted string for nats-server config (escapes `\` and `"`).
    fn quote(s: &str) -> String {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }
}
