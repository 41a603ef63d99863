//! GetSandboxConfig on the test gateway, with the real gateway's auth rules (features sheet
//! §11.1: the bearer is checked, its sandbox must be the one asked for, an unknown sandbox is
//! NOT_FOUND). It answers "no policy configured" (version 0). Served by path beside the
//! generated service, because our proto declares no GetSandboxConfig method.

use std::pin::Pin;
use std::sync::Arc;

use openshell_sandbox::proto::sandbox::v1::{GetSandboxConfigRequest, GetSandboxConfigResponse};
use openshell_sandbox::proto::v1::open_shell_server::OpenShellServer;
use tonic::{Request, Response, Status};

use super::gateway::{Service, State};

pub const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";

type BoxFut<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// The OpenShell service plus GetSandboxConfig.
#[derive(Clone)]
pub struct WithConfig {
    pub inner: OpenShellServer<Service>,
    pub state: Arc<State>,
}

impl tower::Service<http::Request<tonic::body::Body>> for WithConfig {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFut<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() == GET_SANDBOX_CONFIG {
            let svc = ConfigSvc(self.state.clone());
            return Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<
                    GetSandboxConfigResponse,
                    GetSandboxConfigRequest,
                >::default();
                let mut grpc = tonic::server::Grpc::new(codec);
                Ok(grpc.unary(svc, req).await)
            });
        }
        let mut inner = self.inner.clone();
        Box::pin(async move { tower::Service::call(&mut inner, req).await })
    }
}

impl tonic::server::NamedService for WithConfig {
    const NAME: &'static str = "openshell.v1.OpenShell";
}

struct ConfigSvc(Arc<State>);

impl tonic::server::UnaryService<GetSandboxConfigRequest> for ConfigSvc {
    type Response = GetSandboxConfigResponse;
    type Future = BoxFut<Result<Response<GetSandboxConfigResponse>, Status>>;
    fn call(&mut self, req: Request<GetSandboxConfigRequest>) -> Self::Future {
        let st = self.0.clone();
        Box::pin(async move {
            let principal = st.principal(&req)?;
            let r = req.into_inner();
            st.same_sandbox(&principal, &r.sandbox_id)?;
            if r.sandbox_id != st.sandbox_id {
                return Err(Status::not_found("sandbox not found"));
            }
            st.seen.lock().unwrap().config_calls += 1;
            Ok(Response::new(GetSandboxConfigResponse::default()))
        })
    }
}
