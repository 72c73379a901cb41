//! The fake apiserver served over HTTP on loopback, with a kubeconfig for it: for tests that
//! run the `crd-lifecycle` binary as a child process against the fake.

use crate::apiserver::FakeApiserver;

/// Serves the fake over HTTP on loopback and writes a kubeconfig for it.
pub async fn serve_over_http(fake: FakeApiserver) -> (tempfile_path::Path, tokio::task::JoinHandle<()>) {
    use axum::body::{Body as AxumBody, to_bytes};
    let app = axum::Router::new().fallback(move |request: http::Request<AxumBody>| {
        let fake = fake.clone();
        async move {
            let (parts, body) = request.into_parts();
            let bytes = to_bytes(body, 64 << 20).await.unwrap_or_default();
            let response = fake
                .handle(http::Request::from_parts(
                    parts,
                    kube::client::Body::from(bytes.to_vec()),
                ))
                .await;
            let (parts, body) = response.into_parts();
            // Streamed: a watch answers as the CRD changes.
            http::Response::from_parts(parts, AxumBody::new(body))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{address}\"}}\n\
         contexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    );
    (tempfile_path::write(&kubeconfig), server)
}

/// A file in the temp directory, removed on drop.
pub mod tempfile_path {
    pub struct Path(pub std::path::PathBuf);

    impl Drop for Path {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    pub fn write(text: &str) -> Path {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("crd-lifecycle-test-{}-{nanos}.yaml", std::process::id()));
        std::fs::write(&path, text).expect("write kubeconfig");
        Path(path)
    }
}
