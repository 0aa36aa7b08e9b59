"""Stored responses through real gateways to real stubs, with the `openai` SDK: a follow-up with
`previous_response_id` and a retrieval by id reach the replica that stored the response, also
through a gateway that never saw it; round robin would send every second request elsewhere."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Gateway]]:
    with running() as track:
        stubs = [track(start_stub(f"store-{i}")) for i in range(3)]
        pools = {MODEL: pool(*((s.replica_id, s.url) for s in stubs), policy="round_robin")}
        yield (
            track(start_gateway(tmp_path_factory.mktemp("first"), pools)),
            track(start_gateway(tmp_path_factory.mktemp("second"), pools)),
        )


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=20)


def test_follow_ups_reach_the_replica_that_stored_the_response(gateways: tuple[Gateway, Gateway]) -> None:
    first = client(gateways[0]).responses.with_raw_response.create(
        model=MODEL, input="Tell me about the letters of 1907 in the archive.", max_output_tokens=8
    )
    home, previous = first.headers["X-Replica-Id"], first.parse().id
    for stream in (False, True, False, True):
        if stream:
            with client(gateways[0]).responses.with_streaming_response.create(
                model=MODEL, input="And then?", previous_response_id=previous, max_output_tokens=4, stream=True
            ) as answer:
                assert answer.headers["X-Replica-Id"] == home
                events = [line for line in answer.iter_lines() if line.startswith("data:")]
            assert '"response.completed"' in events[-1]
            previous = httpx.Response(200, content=events[-1][5:]).json()["response"]["id"]
        else:
            answer = client(gateways[0]).responses.with_raw_response.create(
                model=MODEL, input="And then?", previous_response_id=previous, max_output_tokens=4
            )
            assert answer.headers["X-Replica-Id"] == home
            parsed = answer.parse()
            assert parsed.previous_response_id == previous
            assert parsed.usage is not None and parsed.usage.input_tokens_details.cached_tokens > 0  # its history
            previous = parsed.id


def test_retrieval_by_id_finds_the_home_also_through_a_gateway_that_never_saw_it(
    gateways: tuple[Gateway, Gateway],
) -> None:
    made = client(gateways[0]).responses.with_raw_response.create(
        model=MODEL, input="Name a colour.", max_output_tokens=4
    )
    for gw in gateways:
        got = client(gw).responses.with_raw_response.retrieve(made.parse().id)
        assert got.headers["X-Replica-Id"] == made.headers["X-Replica-Id"]
        assert got.parse().output_text == made.parse().output_text
    follow = client(gateways[1]).responses.with_raw_response.create(  # learned by the retrieval above
        model=MODEL, input="Another?", previous_response_id=made.parse().id, max_output_tokens=2
    )
    assert follow.headers["X-Replica-Id"] == made.headers["X-Replica-Id"]


def test_an_unknown_or_unstored_id_is_vllms_404(gateways: tuple[Gateway, Gateway]) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client(gateways[0]).responses.retrieve("resp_nobody")
    assert "resp_nobody" in str(err.value)
    unstored = client(gateways[0]).responses.create(model=MODEL, input="Forget me.", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client(gateways[0]).responses.create(
            model=MODEL, input="Remember?", previous_response_id=unstored.id, max_output_tokens=2
        )
