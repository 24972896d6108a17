//! A scorer that runs as a separate HTTP service.
//!
//! **Request** — `POST {endpoint}` with `Content-Type: application/json`, one per chunk:
//!
//! ```json
//! {"images": [{"width": 32, "height": 32, "png": "<base64 PNG>"}, ...],
//!  "prompts": ["a red circle", ...],
//!  "metadata": [{...}, ...]}
//! ```
//!
//! carrying exactly the inputs of [`RemoteConfig::inputs`] (images as 8-bit RGB PNGs, standard
//! base64 with padding).
//!
//! **Response** — HTTP 2xx with `{"components": {"<name>": [v_0, v_1, ...], ...}}`: every
//! component of [`RemoteConfig::components`] must be there with one finite number per sample
//! sent; further components are accepted under the same rules.
//!
//! **Failures**, each a typed [`RewardError`]: no answer within [`RemoteConfig::timeout`]
//! ([`RewardError::RemoteTimeout`]), connection failures ([`RewardError::RemoteTransport`]),
//! a non-2xx status ([`RewardError::RemoteStatus`]), a body that is not JSON
//! ([`RewardError::RemoteJson`]) or not of the layout above ([`RewardError::RemoteProtocol`]),
//! a declared component absent ([`RewardError::RemoteMissingComponent`]), a wrong number of
//! values ([`RewardError::RemoteBatchLength`]), and a value that is `null`, a string or not
//! finite ([`RewardError::RemoteNonFinite`]). Timeouts, connection failures, HTTP 5xx and 429
//! are retried at most [`RemoteConfig::max_retries`] times with exponential backoff; other
//! answers are not retried (a malformed answer does not improve by asking again).
//!
//! Only plain `http://` endpoints are supported (the client is built without TLS): the service
//! is meant to run on the same machine or a private network.

use std::time::Duration;

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::error::{ConfigProblem, RewardError};
use crate::scorer::{Batch, Components, Input, Scorer};

/// Configuration of a [`RemoteScorer`].
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteConfig {
    /// The service's URL (`http://host:port/path`).
    pub endpoint: String,
    /// Components the service must return for every sample.
    pub components: Vec<String>,
    /// Inputs sent (and so required of a batch): images always, prompts and metadata as the
    /// service needs.
    pub inputs: Vec<Input>,
    /// Time limit of one request, from connecting to the end of the response body.
    pub timeout: Duration,
    /// Retries after the first attempt (for timeouts, connection failures, 5xx and 429).
    pub max_retries: u32,
    /// Delay before the first retry; doubled for each further retry.
    pub retry_backoff: Duration,
    /// Samples per request.
    pub chunk_size: usize,
}

impl RemoteConfig {
    /// A configuration sending images and prompts, with a 60 s timeout, 2 retries starting
    /// at 200 ms, and 32 samples per request.
    pub fn new(endpoint: impl Into<String>, components: &[&str]) -> Self {
        Self {
            endpoint: endpoint.into(),
            components: components.iter().map(|c| c.to_string()).collect(),
            inputs: vec![Input::Image, Input::Prompt],
            timeout: Duration::from_secs(60),
            max_retries: 2,
            retry_backoff: Duration::from_millis(200),
            chunk_size: 32,
        }
    }

    /// Checks every field, listing all problems.
    pub fn validate(&self) -> Result<(), RewardError> {
        let mut problems = Vec::new();
        if !self.endpoint.starts_with("http://") {
            problems.push(ConfigProblem::new(
                "endpoint",
                &self.endpoint,
                "an http:// URL (the client is built without TLS)",
            ));
        }
        if self.components.is_empty() {
            problems.push(ConfigProblem::new(
                "components",
                "[]",
                "at least one component name",
            ));
        }
        if !self.inputs.contains(&Input::Image) {
            problems.push(ConfigProblem::new(
                "inputs",
                format!("{:?}", self.inputs),
                "a list containing Image",
            ));
        }
        if self.timeout.is_zero() {
            problems.push(ConfigProblem::new("timeout", "0 s", "a positive duration"));
        }
        if self.chunk_size == 0 {
            problems.push(ConfigProblem::new("chunk_size", 0, "a positive number"));
        }
        if self.max_retries > 10 {
            problems.push(ConfigProblem::new(
                "max_retries",
                self.max_retries,
                "at most 10 (retries must be bounded)",
            ));
        }
        RewardError::config("remote scorer", problems)
    }
}

/// A [`Scorer`] that POSTs batches to a scorer service (see the module documentation for the
/// wire format and the failures).
#[derive(Debug)]
pub struct RemoteScorer {
    config: RemoteConfig,
    agent: ureq::Agent,
}

enum Attempt {
    Done(String),
    Retry(RewardError),
    Fail(RewardError),
}

fn excerpt(body: &str) -> String {
    let mut end = body.len().min(512);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body[..end].to_string()
}

impl RemoteScorer {
    /// A scorer for a validated configuration.
    pub fn new(config: RemoteConfig) -> Result<Self, RewardError> {
        config.validate()?;
        let agent = ureq::AgentBuilder::new().timeout(config.timeout).build();
        Ok(Self { config, agent })
    }

    /// The configuration.
    pub fn config(&self) -> &RemoteConfig {
        &self.config
    }

    fn request_body(&self, batch: &Batch<'_>) -> Result<String, RewardError> {
        let mut body = Map::new();
        let b64 = base64::engine::general_purpose::STANDARD;
        for input in &self.config.inputs {
            match input {
                Input::Image => {
                    let images = batch.images().expect("checked by score");
                    let list = images
                        .iter()
                        .map(|im| {
                            Ok(json!({
                                "width": im.width(),
                                "height": im.height(),
                                "png": b64.encode(im.to_png()?),
                            }))
                        })
                        .collect::<Result<Vec<Value>, RewardError>>()?;
                    body.insert("images".into(), Value::Array(list));
                }
                Input::Prompt => {
                    let p = batch.prompts().expect("checked by score");
                    body.insert("prompts".into(), json!(p));
                }
                Input::Metadata => {
                    let m = batch.metadata().expect("checked by score");
                    body.insert("metadata".into(), Value::Array(m.to_vec()));
                }
            }
        }
        Ok(Value::Object(body).to_string())
    }

    fn attempt(&self, body: &str, attempts: u32) -> Attempt {
        let url = &self.config.endpoint;
        let timeout = || RewardError::RemoteTimeout {
            url: url.clone(),
            timeout: self.config.timeout,
            attempts,
        };
        let is_timeout = |t: &ureq::Transport| {
            std::error::Error::source(t)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(|e| {
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                    )
                })
        };
        match self
            .agent
            .post(url)
            .set("Content-Type", "application/json")
            .send_string(body)
        {
            Ok(resp) => match resp.into_string() {
                Ok(text) => Attempt::Done(text),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                    ) =>
                {
                    Attempt::Retry(timeout())
                }
                Err(e) => Attempt::Retry(RewardError::RemoteTransport {
                    url: url.clone(),
                    attempts,
                    source: Box::new(e),
                }),
            },
            Err(ureq::Error::Status(status, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                let err = RewardError::RemoteStatus {
                    url: url.clone(),
                    status,
                    body: excerpt(&text),
                    attempts,
                };
                if status >= 500 || status == 429 {
                    Attempt::Retry(err)
                } else {
                    Attempt::Fail(err)
                }
            }
            Err(ureq::Error::Transport(t)) if is_timeout(&t) => Attempt::Retry(timeout()),
            Err(ureq::Error::Transport(t)) => Attempt::Retry(RewardError::RemoteTransport {
                url: url.clone(),
                attempts,
                source: Box::new(t),
            }),
        }
    }

    fn post(&self, body: &str) -> Result<String, RewardError> {
        let mut delay = self.config.retry_backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.attempt(body, attempts) {
                Attempt::Done(text) => return Ok(text),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(e) if attempts > self.config.max_retries => return Err(e),
                Attempt::Retry(_) => {
                    std::thread::sleep(delay);
                    delay *= 2;
                }
            }
        }
    }

    fn parse(&self, text: &str, n: usize) -> Result<Vec<Components>, RewardError> {
        let url = &self.config.endpoint;
        let v: Value = serde_json::from_str(text).map_err(|source| RewardError::RemoteJson {
            url: url.clone(),
            source,
            body: excerpt(text),
        })?;
        let Some(components) = v.get("components") else {
            return Err(RewardError::RemoteProtocol {
                url: url.clone(),
                problem: "the answer has no \"components\" field".into(),
            });
        };
        let Some(components) = components.as_object() else {
            return Err(RewardError::RemoteProtocol {
                url: url.clone(),
                problem: format!(
                    "\"components\" is not an object: {}",
                    excerpt(&components.to_string())
                ),
            });
        };
        for name in &self.config.components {
            if !components.contains_key(name) {
                return Err(RewardError::RemoteMissingComponent {
                    url: url.clone(),
                    component: name.clone(),
                });
            }
        }
        let mut out = vec![Components::new(); n];
        for (name, values) in components {
            let Some(values) = values.as_array() else {
                return Err(RewardError::RemoteProtocol {
                    url: url.clone(),
                    problem: format!("component {name} is not a list of numbers"),
                });
            };
            if values.len() != n {
                return Err(RewardError::RemoteBatchLength {
                    url: url.clone(),
                    component: name.clone(),
                    expected: n,
                    found: values.len(),
                });
            }
            for (i, value) in values.iter().enumerate() {
                match value.as_f64() {
                    Some(x) if x.is_finite() => out[i].insert(name.clone(), x),
                    _ => {
                        return Err(RewardError::RemoteNonFinite {
                            url: url.clone(),
                            component: name.clone(),
                            sample: i,
                            value: value.to_string(),
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Scorer for RemoteScorer {
    fn name(&self) -> String {
        format!("remote {}", self.config.endpoint)
    }

    fn required_inputs(&self) -> &[Input] {
        &self.config.inputs
    }

    fn components(&self) -> Vec<String> {
        self.config.components.clone()
    }

    fn chunk_size(&self) -> usize {
        self.config.chunk_size
    }

    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        let body = self.request_body(&batch)?;
        let text = self.post(&body)?;
        self.parse(&text, batch.len())
    }
}
