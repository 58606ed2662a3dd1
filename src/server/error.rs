//! Errors as HTTP answers: a status and the JSON body each API's clients parse — OpenAI's
//! `{error: {message, type, param, code}}` or Anthropic's `{type: "error", error: {type, message}}`.
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::Error;

/// Which API's error shape a route answers with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The engine's typed code, or an HTTP-level one (`unsupported_parameter`, ...).
    pub code: String,
    pub param: Option<String>,
    pub dialect: Dialect,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), code: code.to_string(), param: None, dialect: Dialect::OpenAi }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn param(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..Self::bad_request(format!("{param}: {}", message.into())) }
    }

    /// A parameter of the API that this server does not implement: refused, never ignored.
    pub fn unsupported(param: &str, why: &str) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, "unsupported_parameter", format!("{param} is not supported: {why}"))
        }
    }

    pub fn in_dialect(self, dialect: Dialect) -> Self {
        ApiError { dialect, ..self }
    }

    /// OpenAI's and Anthropic's names for the kind of failure.
    fn kind(&self) -> &'static str {
        match (self.status.as_u16(), self.dialect) {
            (401, Dialect::OpenAi) => "invalid_api_key",
            (401, Dialect::Anthropic) => "authentication_error",
            (404, _) => "not_found_error",
            (413, _) => "request_too_large",
            (429, Dialect::OpenAi) => "rate_limit_exceeded",
            (429, Dialect::Anthropic) => "rate_limit_error",
            (503, Dialect::Anthropic) => "overloaded_error",
            (s, Dialect::Anthropic) if s >= 500 => "api_error",
            (s, Dialect::OpenAi) if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::InvalidOption { .. } | Error::InvalidPrompt(_) | Error::InvalidGrammar(_) | Error::UnsupportedOption { .. } | Error::Template(_) | Error::Tokenizer(_) => {
                StatusCode::BAD_REQUEST
            }
            Error::AdmissionRejected(_) => StatusCode::TOO_MANY_REQUESTS,
            // A context the memory budget cannot hold, as hosted APIs answer a context too long.
            _ if e.code() == "INSUFFICIENT_MEMORY" => StatusCode::BAD_REQUEST,
            Error::EngineClosed | Error::EngineDead => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.dialect {
            Dialect::OpenAi => json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}}),
            Dialect::Anthropic => json!({"type": "error", "error": {"type": self.kind(), "message": self.message}}),
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
