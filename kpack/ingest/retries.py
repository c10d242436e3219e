"""Retries of a request: after connection errors, timeouts and RETRY_STATUSES, with
exponential backoff or the server's ``Retry-After`` (at most MAX_RETRY_AFTER_S), all within the
fetch's deadline (tenacity)."""

from __future__ import annotations

import requests
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_any,
    wait_exponential,
)
from urllib3.exceptions import InvalidHeader
from urllib3.util.retry import Retry

from kpack.ingest.deadline import Deadline
from kpack.ingest.throttle import HostThrottle

RETRY_STATUSES = {429, 500, 502, 503, 504}
RETRIED_ERRORS = (requests.ConnectionError, requests.Timeout)
MAX_RETRY_AFTER_S = 30
# urllib3's parser of Retry-After (seconds or an HTTP date), capped at MAX_RETRY_AFTER_S.
RETRY_AFTER = Retry(retry_after_max=MAX_RETRY_AFTER_S)


def get_with_retries(
    session: requests.Session,
    url: str,
    headers: dict[str, str],
    deadline: Deadline,
    *,
    throttle: HostThrottle,
    timeout_s: float,
    retries: int,
    backoff_s: float,
) -> requests.Response:
    """The answer to one GET (no redirects followed, the body streamed), retried (tenacity)
    after RETRIED_ERRORS and RETRY_STATUSES up to ``retries`` times within the deadline: the
    last retried status is returned as it is, the last error raised. Each attempt waits for
    the host's turn (``throttle``)."""

    def attempt() -> requests.Response:
        throttle.wait(url)
        deadline.start()
        deadline.check()
        return session.get(
            url,
            headers=headers,
            timeout=min(timeout_s, deadline.remaining()),
            stream=True,
            allow_redirects=False,
        )

    backoff = wait_exponential(multiplier=backoff_s, max=MAX_RETRY_AFTER_S)

    def wait(state: RetryCallState) -> float:
        answer = _answer(state)
        delay = _retry_after(answer) if answer is not None else None
        return min(backoff(state) if delay is None else delay, deadline.remaining())

    def close_answer(state: RetryCallState) -> None:
        answer = _answer(state)
        if answer is not None:
            answer.close()

    retrying = Retrying(
        retry=retry_if_exception_type(RETRIED_ERRORS)
        | retry_if_result(lambda answer: answer.status_code in RETRY_STATUSES),
        stop=stop_any(stop_after_attempt(retries + 1), lambda _: deadline.expired),
        wait=wait,
        before_sleep=close_answer,
        retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
    )
    return retrying(attempt)


def _answer(state: RetryCallState) -> requests.Response | None:
    """The response an attempt returned; None when it raised."""
    outcome = state.outcome
    return None if outcome is None or outcome.failed else outcome.result()


def _retry_after(response: requests.Response) -> float | None:
    """The seconds a ``Retry-After`` header asks for (at most MAX_RETRY_AFTER_S), if any."""
    value = response.headers.get("retry-after")
    try:
        return RETRY_AFTER.parse_retry_after(value) if value else None
    except InvalidHeader:
        return None
