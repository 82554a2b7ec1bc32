"""Who may do what on a swarm server: the admin token, client tokens and episode keys.

Three roles (docs/ARCHITECTURE.md §Credentials and limits):

- the **admin token** guards the control routes (and may also act on any episode);
- a **client token** begins episodes; with any configured, beginning needs one;
- an **episode key** (``sk-swarm-…``, minted by begin) samples completions of its episode; it, the client
  token that began the episode, or the admin token finishes, aborts, heartbeats and reads that episode,
  and nothing else does: a caller without a credential is never an episode's owner, on any server.

Every credential arrives as ``Authorization: Bearer <secret>`` (an episode key may also come as
``x-api-key``, the Anthropic SDK's header). A missing credential is a 401, a wrong one a 403, and each
message says which credential the route wants. Secrets are compared in constant time
(:func:`hmac.compare_digest`) and only their SHA-256 digests are kept; no message, log line, event,
metric or pool row ever carries one: episodes' owners are named by the client token's *name*.

:class:`Credentials` is the logic (no FastAPI); the ``*Dep`` aliases and :func:`require_admin` are the
FastAPI dependencies routes declare.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr
from starlette.routing import BaseRoute

from swarm.errors import AuthError, RequestError
from swarm.protocol import ADMIN_OWNER
from swarm.server.episodes import KEY_PREFIX, OpenEpisode, OpenEpisodes
from swarm.server.limits import ClientLimits

MINTED_PREFIX = "swc-"
"""Prefix of the client tokens the server mints (``POST /api/v1/client-tokens`` without a token)."""

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", "testclient"})
"""Peers that count as this machine (``testclient`` is Starlette's in-process test peer)."""


def digest(secret: str) -> str:
    """SHA-256 hex digest of a secret (what the server keeps instead of the secret)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def same_digest(a: str, b: str) -> bool:
    """Constant-time equality of two digests."""
    return hmac.compare_digest(a.encode(), b.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to listen on or a peer's address) is this machine only."""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


@dataclass(frozen=True)
class Owner:
    """Who began an episode: the client token's name (``None``: begun without a client token, on a server
    that asks for none; ``admin``: with the admin token)."""

    name: str | None


class Credentials:
    """The admin token and the live client-token table of one server.

    Args:
        admin_token: the control routes' token (``None``: control routes are open to loopback peers).
        client_tokens: client tokens by name. Once the server has had one (at start or added live), every
            begin needs a client token, even after all are revoked.
    """

    def __init__(self, admin_token: SecretStr | None, client_tokens: Mapping[str, SecretStr]) -> None:
        self._admin = digest(admin_token.get_secret_value()) if admin_token is not None else None
        self._by_digest: dict[str, str] = {}
        self._by_name: dict[str, str] = {}
        self._tenants: dict[str, frozenset[str]] = {}
        """Client token name → the LoRA tenants it may begin episodes under (absent: any)."""
        self.required = False
        """Whether beginning an episode needs a client token."""
        for name, token in client_tokens.items():
            self.add(name, token.get_secret_value())

    # -- the client-token table ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Names of the client tokens that work now, in the order they were added."""
        return list(self._by_name)

    def tenants_of(self, name: str) -> list[str] | None:
        """The LoRA tenants client token ``name`` may begin episodes under, sorted (``None``: any)."""
        allowed = self._tenants.get(name)
        return None if allowed is None else sorted(allowed)

    def add(self, name: str, token: str | None = None, tenants: Iterable[str] | None = None) -> str:
        """Add a client token (``None`` mints a random one) and return it; from now on begins need one.
        ``tenants``: the LoRA tenants it may begin episodes under (``None``: no restriction).

        Raises:
            RequestError: the name is taken, or the secret is already a client or the admin token (409);
                the name is `ADMIN_OWNER`, which names the admin token's episodes (422).
        """
        if name == ADMIN_OWNER:
            raise RequestError(
                f"the client-token name {ADMIN_OWNER!r} is reserved for the admin token; choose another",
                status_code=422,
                param="name",
            )
        if name in self._by_name:
            raise RequestError(f"a client token named {name!r} exists; revoke it first", status_code=409)
        secret = token if token is not None else MINTED_PREFIX + secrets.token_urlsafe(32)
        hashed = digest(secret)
        if hashed in self._by_digest or (self._admin is not None and same_digest(hashed, self._admin)):
            raise RequestError(
                "this secret is already in use by another token; choose another", status_code=409
            )
        if secret.startswith(KEY_PREFIX):
            raise RequestError(
                f"a client token may not start with {KEY_PREFIX!r} (episode keys do)", status_code=422
            )
        self._by_digest[hashed] = name
        self._by_name[name] = hashed
        if tenants is not None:
            self._tenants[name] = frozenset(tenants)
        self.required = True
        return secret

    def revoke(self, name: str) -> None:
        """Revoke client token ``name`` at once (its open episodes keep their episode keys).

        Raises:
            RequestError: no client token has this name (404).
        """
        hashed = self._by_name.pop(name, None)
        if hashed is None:
            raise RequestError(f"no client token named {name!r}", status_code=404, param="name")
        del self._by_digest[hashed]
        self._tenants.pop(name, None)

    def check_tenant(self, owner: str | None, tenant: str | None) -> None:
        """Whether client token ``owner`` may begin an episode under ``tenant`` (the admin and tokens
        without a tenant list may begin under any).

        Raises:
            AuthError: the token is limited to other tenants, or to tenants and ``tenant`` is ``None`` (403).
        """
        allowed = None if owner is None else self._tenants.get(owner)
        if allowed is not None and tenant not in allowed:
            asked = "without a tenant" if tenant is None else f"under tenant {tenant!r}"
            raise AuthError(
                f"client token {owner!r} may not begin episodes {asked} (its tenants: {sorted(allowed)})",
                status_code=403,
            )

    # -- checks --------------------------------------------------------------------------------------------
    @property
    def has_admin(self) -> bool:
        """Whether an admin token is configured (else control routes answer loopback peers only)."""
        return self._admin is not None

    def is_admin(self, secret: str) -> bool:
        """Whether ``secret`` is the admin token (constant time)."""
        return self._admin is not None and same_digest(digest(secret), self._admin)

    def client_name(self, secret: str) -> str | None:
        """The name of the client token ``secret``, or ``None`` when it is none (revoked included)."""
        hashed = digest(secret)
        name = self._by_digest.get(hashed)
        # the dict lookup is by digest; compare once more in constant time, as for the admin token
        return name if name is not None and same_digest(self._by_name.get(name, ""), hashed) else None

    def admin(self, secret: str | None, peer: str) -> None:
        """Allow a control route.

        Raises:
            AuthError: 401 without a credential where the admin token is configured; 403 for an episode
                key, a client token, a wrong token, or a non-loopback peer of a server without one.
        """
        if secret is not None and secret.startswith(KEY_PREFIX):
            raise AuthError(
                "episode API keys cannot call control routes; use the admin token", status_code=403
            )
        if self._admin is None:
            if not is_loopback(peer):
                raise AuthError(
                    "control routes need an admin token when called from another host (start the server "
                    "with --admin-token or SWARM_ADMIN_TOKEN)",
                    status_code=403,
                )
            return
        if secret is None:
            raise AuthError("missing admin token: control routes need 'Authorization: Bearer <admin token>'")
        if self.is_admin(secret):
            return
        if self.client_name(secret) is not None:
            raise AuthError("client tokens cannot call control routes; use the admin token", status_code=403)
        raise AuthError("wrong admin token for a control route", status_code=403)

    def begin(self, secret: str | None, action: str = "beginning an episode") -> Owner:
        """Who is beginning an episode (or, with ``action``, doing another client's act: voting,
        heartbeating or leaving, which a stranger could otherwise fake).

        Raises:
            AuthError: 401 without a credential where client tokens are required; 403 for an episode key
                or a wrong (unknown or revoked) client token.
        """
        if secret is not None and secret.startswith(KEY_PREFIX):
            raise AuthError(
                f"an episode API key cannot be used for {action}; use a client token", status_code=403
            )
        if secret is not None and self.is_admin(secret):
            return Owner(ADMIN_OWNER)
        if not self.required:
            return Owner(None)  # a trusted network: whatever a client sends is not checked
        if secret is None:
            raise AuthError(
                f"missing client token: {action} needs 'Authorization: Bearer <client token>' "
                "(swarm run --client-token, or SWARM_CLIENT_TOKEN)"
            )
        name = self.client_name(secret)
        if name is None:
            raise AuthError("wrong client token (unknown or revoked)", status_code=403)
        return Owner(name)

    def episode(self, secret: str | None, episode_id: str, key_digest: str | None, owner: str | None) -> None:
        """Allow finishing, aborting, heartbeating or reading episode ``episode_id``, whose key has
        ``key_digest`` and which ``owner`` began: only its episode key, the admin token, or the client token
        that began it. A caller without a credential is never an owner, whatever the server's token
        settings (an episode begun without a client token has no owner but its key and the admin).

        Raises:
            AuthError: 401 without a credential; 403 for another episode's key, a client token that did not
                begin this episode, or any other secret.
        """
        if secret is None:
            raise AuthError(f"missing credential for episode {episode_id}: send {self._episode_credential()}")
        if secret.startswith(KEY_PREFIX):
            if key_digest is not None and same_digest(digest(secret), key_digest):
                return
            raise AuthError(f"this episode API key does not belong to episode {episode_id}", status_code=403)
        if self.is_admin(secret):
            return
        name = self.client_name(secret)
        if name is not None:
            if owner == name and owner != ADMIN_OWNER:
                return
            raise AuthError(f"client token {name!r} did not begin episode {episode_id}", status_code=403)
        raise AuthError(
            f"wrong credential for episode {episode_id}: send {self._episode_credential()}", status_code=403
        )

    def _episode_credential(self) -> str:
        """The credentials an episode route takes on this server, in words (no admin token where none is
        configured, no client token where none was ever required)."""
        kinds = ["the episode's api_key"]
        if self.required:
            kinds.append("the client token that began it")
        if self._admin is not None:
            kinds.append("the admin token")
        listed = ", ".join(kinds[:-1]) + ("," if len(kinds) > 2 else "") + " or " + kinds[-1]
        return f"'Authorization: Bearer <{kinds[0]}>'" if len(kinds) == 1 else listed


# -- FastAPI dependencies ------------------------------------------------------------------------------------
class Guarded(Protocol):
    """What the dependencies below need of the server (`swarm.server.episode_service.EpisodeService`,
    which imports this module, so it is named structurally here)."""

    credentials: Credentials
    episodes: OpenEpisodes
    limits: ClientLimits

    def episode_credentials(self, episode_id: str) -> tuple[str | None, str | None]: ...


_bearer = HTTPBearer(auto_error=False)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="An episode key (Anthropic SDKs).")
ApiKeyDep = Annotated[str | None, Depends(_api_key)]
"""The ``x-api-key`` header, declared as the alternative credential of the completion routes (the
document's ``security`` lists bearer *or* it, so a client and a fuzzer know either one is the key)."""


def _guarded(request: Request) -> Guarded:
    """The episode service of a request's server. Read here rather than declared as a dependency of its
    own: each dependency is one more ``solve_dependencies`` pass per request, and these run on every
    request of the hot path (begin, completion, finish)."""
    service: Guarded = request.app.state.runtime.episode_service
    return service


def _secret(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,31}")
"""An ``Authorization`` scheme as RFC 9110 section 11.1 writes it (bounded: it is echoed in a message)."""


def _explained(request: Request, refused: AuthError, *, api_key_taken: bool = False) -> AuthError:
    """``refused`` with what the request sent instead of a bearer credential, when it is a 401 and the
    request sent one the wrong way: another ``Authorization`` scheme (``Basic …``), a bare ``Bearer``, or
    ``x-api-key`` on a route that does not take it (``api_key_taken``: the completion routes take it).
    The credential itself is never echoed."""
    if refused.status_code != 401:
        return refused
    header = request.headers.get("authorization")
    if header is not None:
        scheme = header.split(" ", 1)[0]
        if scheme.lower() == "bearer":
            why = "the Authorization header carries no token after 'Bearer'"
        else:
            named = repr(scheme) if _SCHEME.fullmatch(scheme) else "another scheme"
            why = f"the Authorization header uses {named}; send 'Authorization: Bearer <token>'"
    elif request.headers.get("x-api-key") is not None and not api_key_taken:
        why = (
            "x-api-key is taken only by the completion routes (/v1/messages, /v1/chat/completions) for an "
            "episode's api_key; this route takes 'Authorization: Bearer <token>'"
        )
    else:
        return refused
    return AuthError(f"{refused} ({why})")


async def require_admin(request: Request, credentials: BearerDep) -> None:
    """Control routes: the admin token when one is configured, loopback peers only when none is."""
    host = request.client.host if request.client else ""
    try:
        _guarded(request).credentials.admin(_secret(credentials), host)
    except AuthError as exc:
        raise _explained(request, exc) from None


async def get_owner(request: Request, credentials: BearerDep) -> Owner:
    """Begin: the client token's owner (:meth:`Credentials.begin`)."""
    try:
        return _guarded(request).credentials.begin(_secret(credentials))
    except AuthError as exc:
        raise _explained(request, exc) from None


OwnerDep = Annotated[Owner, Depends(get_owner)]


async def require_client(request: Request, credentials: BearerDep) -> None:
    """Client routes (votes, client heartbeats, leaving): a client token or the admin token where client
    tokens are required, as for begin (:meth:`Credentials.begin`)."""
    try:
        _guarded(request).credentials.begin(_secret(credentials), "a client's vote, heartbeat or leave")
    except AuthError as exc:
        raise _explained(request, exc) from None


async def require_scorer(request: Request, credentials: BearerDep) -> None:
    """``POST /v1/score`` and ``/tokenize`` (a distilling server's teacher calls): a client token or the
    admin token where client tokens are required, as for begin (:meth:`Credentials.begin`); a client
    token's call counts against its request rate (429 + Retry-After over it), as a begin or a chat call
    does."""
    server = _guarded(request)
    try:
        owner = server.credentials.begin(_secret(credentials), "scoring or tokenizing")
    except AuthError as exc:
        raise _explained(request, exc) from None
    server.limits.take(owner.name)


async def check_episode_access(episode_id: str, request: Request, credentials: BearerDep) -> None:
    """Episode routes: :meth:`Credentials.episode` for the episode in the path (404 when there is none;
    a missing credential is refused first, so an unknown id tells a caller without one nothing)."""
    server = _guarded(request)
    secret = _secret(credentials)
    if secret is None:
        try:
            server.credentials.episode(None, episode_id, None, None)
        except AuthError as exc:
            raise _explained(request, exc) from None
    key_digest, owner = server.episode_credentials(episode_id)
    server.credentials.episode(secret, episode_id, key_digest, owner)


async def get_episode(request: Request, credentials: BearerDep, x_api_key: ApiKeyDep) -> OpenEpisode:
    """The open episode named by its key: ``Authorization: Bearer <episode key>`` (OpenAI SDKs) or
    ``x-api-key: <episode key>`` (Anthropic SDKs). Without one: 401; a key of no open episode (wrong, or
    its episode has ended), a client or an admin token: 403 (a wrong credential, as on the episode routes)."""
    server = _guarded(request)
    key = _secret(credentials) or x_api_key
    if key is None:
        missing = AuthError(
            "missing episode API key: send 'Authorization: Bearer <api_key from POST /api/v1/episodes>' "
            "(or 'x-api-key: <api_key>' from an Anthropic SDK)"
        )
        raise _explained(request, missing, api_key_taken=True)
    if not key.startswith(KEY_PREFIX) and (
        server.credentials.is_admin(key) or server.credentials.client_name(key) is not None
    ):
        raise AuthError(
            "client and admin tokens cannot sample completions; use the api_key of the episode "
            "(from POST /api/v1/episodes)",
            status_code=403,
        )
    return server.episodes.for_key(key)


EpisodeDep = Annotated[OpenEpisode, Depends(get_episode)]


async def check_before_body(request: Request) -> None:
    """Run the credential checks of the route ``request`` matched, for a request whose body could not be
    parsed: FastAPI (and `swarm.server.lean_route`) parse a JSON body before they solve dependencies, so a
    caller without credentials got 400 for a malformed body but 401 for an empty or missing one
    (fresh-s5 #12). The error handlers call this first, so every refusal of a credential comes before any
    word about the body. Only on the error path: the hot path is unchanged.

    Raises:
        AuthError: What the route's credential dependency raises (401 without one, 403 for a wrong one).
        RequestError: An episode route's 404 for an episode that does not exist (with a credential).
    """
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if not isinstance(dependant, Dependant):
        return
    calls = _calls(dependant)
    credentials = await _bearer(request)
    if get_episode in calls:
        await get_episode(request, credentials, await _api_key(request))
    if check_episode_access in calls:
        await check_episode_access(str(request.path_params.get("episode_id", "")), request, credentials)
    for check in (require_admin, get_owner, require_client, require_scorer):
        if check in calls:
            await check(request, credentials)


# -- the OpenAPI document ------------------------------------------------------------------------------------
def optional_security(
    openapi: dict[str, Any], routes: Iterable[BaseRoute], credentials: Credentials
) -> dict[str, Any]:
    """``openapi`` as this server enforces it: each operation whose credential the server does not require
    also lists the empty security requirement (``{}``: no credential). Those are begin and the client routes
    on a server without client tokens, and the control routes on a server without an admin token (loopback
    peers only). Episode and completion routes always need a credential. ``openapi`` is not modified.
    """
    optional: set[Any] = set()
    if not credentials.required:
        optional |= {get_owner, require_client, require_scorer}
    if not credentials.has_admin:
        optional.add(require_admin)
    if not optional:
        return openapi
    document = copy.deepcopy(openapi)
    for path, methods, dependant in _api_routes(routes):
        if not optional & _calls(dependant):
            continue
        for method in methods:
            operation = document["paths"].get(path, {}).get(method.lower())
            if operation is not None and {} not in operation.setdefault("security", []):
                operation["security"].append({})
    return document


def _api_routes(routes: Iterable[BaseRoute]) -> Iterator[tuple[str, set[str], Dependant]]:
    """The path, methods and dependencies of every FastAPI route among ``routes``, those of included
    routers included: FastAPI 0.16x keeps an included router as one wrapper route (no ``dependant``, no
    ``path_format``) whose routes only its ``iter_route_contexts`` reaches; older versions copy them in."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before 0.16x: the app's routes are the included ones
        for route in routes:
            if isinstance(route, APIRoute):
                yield route.path_format, route.methods or set(), route.dependant
        return
    for context in iter_route_contexts(list(routes)):
        if not isinstance(context.original_route, APIRoute):
            continue
        dependant: Dependant | None = context.dependant  # the route's, with its including routers'
        if dependant is not None:
            yield context.path_format or "", context.methods or set(), dependant


def _calls(dependant: Dependant) -> set[Any]:
    """Every dependency callable of ``dependant``, sub-dependencies included."""
    calls = set()
    for sub in dependant.dependencies:
        calls.add(sub.call)
        calls |= _calls(sub)
    return calls
