"""What cotrain.hivemind_private uses of hivemind's private API is still there: a hivemind release that changes it
fails here, not in a coordinator that finds every node unreachable."""

import asyncio

import pytest
from hivemind.p2p import P2P
from hivemind.utils.multiaddr import Multiaddr

from cotrain import hivemind_private


@pytest.mark.swarm  # two libp2p daemons
def test_the_daemon_client_dials_a_peer_at_its_address_and_hangs_up():
    async def main():
        server = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        client = await P2P.create(host_maddrs=[], no_listen=True, dht_mode="client")
        try:
            # the addresses without their /p2p/ part, as the coordinator's check takes them (parse_peer)
            maddrs = [Multiaddr(str(m).split("/p2p/")[0]) for m in await server.get_visible_maddrs()]
            await asyncio.wait_for(hivemind_private.connect(client, server.peer_id, maddrs), timeout=20)
            assert server.peer_id in {info.peer_id for info in await client.list_peers()}
            await hivemind_private.disconnect(client, server.peer_id)
        finally:
            await client.shutdown()
            await server.shutdown()

    asyncio.run(main())


def test_a_p2p_without_the_client_is_named_as_hiveminds_change():
    class Changed:
        pass

    with pytest.raises(hivemind_private.HivemindChanged, match="_client"):
        asyncio.run(hivemind_private.connect(Changed(), None, []))


@pytest.mark.swarm  # two libp2p daemons
def test_a_request_its_caller_gave_up_on_leaves_no_task_behind():
    """hivemind kept the task of every served request whose caller timed out, for the life of the process."""
    import time

    from hivemind.proto import dht_pb2

    async def main():
        server = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        client = await P2P.create(initial_peers=await server.get_visible_maddrs(), host_maddrs=[], no_listen=True)
        started = asyncio.Event()

        async def slow(request, context):
            started.set()
            await asyncio.sleep(60)
            return request

        try:
            await server.add_protobuf_handler("slow", slow, dht_pb2.PingRequest)
            for _ in range(3):
                started.clear()
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.call_protobuf_handler(server.peer_id, "slow", dht_pb2.PingRequest(),
                                                                        dht_pb2.PingRequest), timeout=2)
                assert started.is_set()
            deadline = time.monotonic() + 20
            while server._client.control._handler_tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not server._client.control._handler_tasks
        finally:
            await client.shutdown()
            await server.shutdown()

    asyncio.run(main())
