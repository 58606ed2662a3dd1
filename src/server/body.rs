//! A request body read whole (up to the server's limit) and parsed as JSON, with failures in the
//! error shape of the route's API: `413` over the limit, `400` naming the bad or unknown field.
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::{ApiError, Dialect};

pub struct Body {
    bytes: Bytes,
    dialect: Dialect,
}

fn dialect_of(path: &str) -> Dialect {
    if path == "/v1/messages" {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    }
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let dialect = dialect_of(request.uri().path());
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Body { bytes, dialect }),
            Err(e) => Err(ApiError::new(e.status(), "invalid_body", e.body_text()).in_dialect(dialect)),
        }
    }
}

impl Body {
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(&self.bytes).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")).in_dialect(self.dialect))
    }
}
