//! The remote scorer against real HTTP servers started here on loopback: a JPEG-reward
//! service, a slow one, failing ones and ones that answer nonsense — each failure a typed error.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine;
use reward::jpeg::{self, INCOMPRESSIBILITY};
use reward::{
    Batch, JpegReward, JpegScorer, RemoteConfig, RemoteScorer, RewardError, RgbImage, Scorer,
};
use serde_json::{Value, json};

/// What a test server answers to one request body: status, body, delay before answering.
type Handler = dyn Fn(&Value) -> (u16, String, Duration) + Send + Sync;

/// A loopback HTTP server running `handler` on a thread per request; stops when dropped.
struct Server {
    url: String,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(handler: impl Fn(&Value) -> (u16, String, Duration) + Send + Sync + 'static) -> Self {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("bind loopback");
        let port = server.server_addr().to_ip().expect("ip").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let (h, s) = (hits.clone(), stop.clone());
        thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok(Some(mut req)) = server.recv_timeout(Duration::from_millis(20)) else {
                    continue;
                };
                h.fetch_add(1, Ordering::SeqCst);
                let handler = handler.clone();
                thread::spawn(move || {
                    let mut body = String::new();
                    let _ = req.as_reader().read_to_string(&mut body);
                    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    let (status, text, delay) = handler(&v);
                    thread::sleep(delay);
                    let _ = req
                        .respond(tiny_http::Response::from_string(text).with_status_code(status));
                });
            }
        });
        Self {
            url: format!("http://127.0.0.1:{port}/score"),
            hits,
            stop,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn images(n: usize) -> (Vec<RgbImage>, Vec<String>) {
    let images = (0..n)
        .map(|k| {
            RgbImage::from_fn(16 + 4 * k, 12 + 3 * k, |x, y| {
                [
                    (x * 17 + k * 40) as u8,
                    (y * 29) as u8,
                    ((x * y) % 251) as u8,
                ]
            })
        })
        .collect();
    let prompts = (0..n).map(|k| format!("prompt {k}")).collect();
    (images, prompts)
}

fn config(url: &str) -> RemoteConfig {
    let mut c = RemoteConfig::new(url, &[INCOMPRESSIBILITY]);
    c.timeout = Duration::from_millis(2000);
    c.max_retries = 2;
    c.retry_backoff = Duration::from_millis(10);
    c
}

/// The JPEG-incompressibility service: decodes each PNG and answers its JPEG size in kB.
fn jpeg_service(v: &Value) -> (u16, String, Duration) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let sizes: Vec<f64> = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|im| {
            let png = b64.decode(im["png"].as_str().unwrap()).unwrap();
            let mut reader = png::Decoder::new(std::io::Cursor::new(png))
                .read_info()
                .unwrap();
            let mut buf = vec![0; reader.output_buffer_size().unwrap()];
            let info = reader.next_frame(&mut buf).unwrap();
            let (w, h) = (info.width as usize, info.height as usize);
            assert_eq!(
                (w, h),
                (
                    im["width"].as_u64().unwrap() as usize,
                    im["height"].as_u64().unwrap() as usize
                )
            );
            let image = RgbImage::new(w, h, buf[..w * h * 3].to_vec()).unwrap();
            jpeg::size_kb(&image, 95).unwrap()
        })
        .collect();
    assert_eq!(v["prompts"].as_array().unwrap().len(), sizes.len());
    (
        200,
        json!({"components": {INCOMPRESSIBILITY: sizes}}).to_string(),
        Duration::ZERO,
    )
}

#[test]
fn jpeg_service_scores_like_the_local_scorer_in_chunks() {
    let server = Server::start(jpeg_service);
    let mut c = config(&server.url);
    c.chunk_size = 2;
    let remote = RemoteScorer::new(c).unwrap();
    let (imgs, prompts) = images(5);
    let batch = Batch::images_and_prompts(&imgs, &prompts).unwrap();
    let got = remote.score(batch).unwrap();
    let want = JpegScorer::ddpo(JpegReward::Incompressibility)
        .score(batch)
        .unwrap();
    assert_eq!(got, want);
    assert_eq!(server.hits(), 3, "5 samples in chunks of 2");
}

#[test]
fn a_slow_service_times_out_after_bounded_retries() {
    let server = Server::start(|_| {
        (
            200,
            "{\"components\": {}}".into(),
            Duration::from_millis(1500),
        )
    });
    let mut c = config(&server.url);
    c.timeout = Duration::from_millis(250);
    c.max_retries = 1;
    let remote = RemoteScorer::new(c).unwrap();
    let (imgs, prompts) = images(2);
    let t = Instant::now();
    let err = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap_err();
    let elapsed = t.elapsed();
    assert!(
        matches!(err, RewardError::RemoteTimeout { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(
        elapsed < Duration::from_millis(1400),
        "gave up after {elapsed:?}"
    );
    assert_eq!(server.hits(), 2);
}

#[test]
fn http_500_is_retried_then_reported() {
    let server = Server::start(|_| (500, "model crashed".into(), Duration::ZERO));
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, prompts) = images(1);
    let err = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap_err();
    match &err {
        RewardError::RemoteStatus {
            status: 500,
            body,
            attempts: 3,
            ..
        } => assert_eq!(body, "model crashed"),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.hits(), 3, "1 attempt + 2 retries");
}

#[test]
fn a_transient_503_is_survived() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let server = Server::start(move |v| {
        if c2.fetch_add(1, Ordering::SeqCst) == 0 {
            (503, "warming up".into(), Duration::ZERO)
        } else {
            jpeg_service(v)
        }
    });
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, prompts) = images(2);
    let out = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(server.hits(), 2);
}

#[test]
fn http_400_is_not_retried() {
    let server = Server::start(|_| (400, "bad request".into(), Duration::ZERO));
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, prompts) = images(1);
    let err = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RewardError::RemoteStatus {
                status: 400,
                attempts: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(server.hits(), 1);
}

#[test]
fn malformed_json_is_a_typed_error_without_retry() {
    let server = Server::start(|_| (200, "{\"components\": [1, 2".into(), Duration::ZERO));
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, prompts) = images(2);
    let err = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap_err();
    match &err {
        RewardError::RemoteJson { body, .. } => assert!(body.starts_with("{\"components\"")),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.hits(), 1);
}

#[test]
fn a_wrong_length_answer_is_a_typed_error() {
    let server = Server::start(|v| {
        let n = v["images"].as_array().unwrap().len();
        (
            200,
            json!({"components": {INCOMPRESSIBILITY: vec![1.0; n - 1]}}).to_string(),
            Duration::ZERO,
        )
    });
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, prompts) = images(3);
    let err = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, RewardError::RemoteBatchLength { expected: 3, found: 2, component, .. } if component == INCOMPRESSIBILITY),
        "{err:?}"
    );
}

#[test]
fn non_finite_values_are_typed_errors() {
    for bad in [json!(null), json!("NaN"), json!("inf")] {
        let b = bad.clone();
        let server = Server::start(move |_| {
            (
                200,
                json!({"components": {INCOMPRESSIBILITY: [1.5, b.clone()]}}).to_string(),
                Duration::ZERO,
            )
        });
        let remote = RemoteScorer::new(config(&server.url)).unwrap();
        let (imgs, prompts) = images(2);
        let err = remote
            .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
            .unwrap_err();
        assert!(
            matches!(err, RewardError::RemoteNonFinite { sample: 1, .. }),
            "{bad}: {err:?}"
        );
    }
    // a number JSON cannot hold as f64 is refused by the parser
    let server = Server::start(|_| {
        (
            200,
            "{\"components\": {\"jpeg_incompressibility\": [1e999]}}".into(),
            Duration::ZERO,
        )
    });
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, prompts) = images(1);
    let err = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RewardError::RemoteJson { .. } | RewardError::RemoteNonFinite { .. }
        ),
        "{err:?}"
    );
}

#[test]
fn missing_or_misshapen_components_are_typed_errors() {
    let server = Server::start(|_| {
        (
            200,
            json!({"components": {"other": [1.0]}}).to_string(),
            Duration::ZERO,
        )
    });
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, prompts) = images(1);
    let batch = Batch::images_and_prompts(&imgs, &prompts).unwrap();
    assert!(matches!(
        remote.score(batch),
        Err(RewardError::RemoteMissingComponent { .. })
    ));
    let server = Server::start(|_| {
        (
            200,
            json!({"components": [1.0]}).to_string(),
            Duration::ZERO,
        )
    });
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    assert!(matches!(
        remote.score(batch),
        Err(RewardError::RemoteProtocol { .. })
    ));
    let server = Server::start(|_| (200, json!({"scores": [1.0]}).to_string(), Duration::ZERO));
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    assert!(matches!(
        remote.score(batch),
        Err(RewardError::RemoteProtocol { .. })
    ));
}

#[test]
fn an_unreachable_service_is_a_transport_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let remote = RemoteScorer::new(config(&format!("http://127.0.0.1:{port}/score"))).unwrap();
    let (imgs, prompts) = images(1);
    let err = remote
        .score(Batch::images_and_prompts(&imgs, &prompts).unwrap())
        .unwrap_err();
    assert!(
        matches!(err, RewardError::RemoteTransport { attempts: 3, .. }),
        "{err:?}"
    );
}

#[test]
fn configuration_problems_are_listed_together() {
    let mut c = RemoteConfig::new("https://example.invalid/score", &[]);
    c.chunk_size = 0;
    c.max_retries = 100;
    match RemoteScorer::new(c) {
        Err(RewardError::InvalidConfig { problems, .. }) => {
            let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
            assert_eq!(
                fields,
                ["endpoint", "components", "chunk_size", "max_retries"]
            );
        }
        other => panic!("{other:?}"),
    }
    let server = Server::start(jpeg_service);
    let remote = RemoteScorer::new(config(&server.url)).unwrap();
    let (imgs, _) = images(1);
    let err = remote
        .score(Batch::new(Some(&imgs), None, None).unwrap())
        .unwrap_err();
    assert!(matches!(err, RewardError::MissingInput { .. }), "{err:?}");
    assert_eq!(server.hits(), 0);
}
