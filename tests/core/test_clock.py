import asyncio

from batchlab.core.clock import RealClock, VirtualClock


def test_virtual_time_jumps_and_orders_timers():
    clock = VirtualClock()
    seen = []

    async def sleeper(name, dt):
        await clock.sleep(dt)
        seen.append((name, clock.now()))

    async def main():
        await asyncio.gather(sleeper("late", 3600.0), sleeper("early", 0.5), sleeper("tie-a", 2.0),
                             sleeper("tie-b", 2.0))

    clock.run(main())
    assert seen == [("early", 0.5), ("tie-a", 2.0), ("tie-b", 2.0), ("late", 3600.0)]


def test_equal_time_order_is_the_same_every_run():
    def once():
        clock, order = VirtualClock(), []

        async def worker(i):
            for k in range(5):
                await clock.sleep(0.1 * ((i + k) % 3))
                order.append(i)

        async def main():
            await asyncio.gather(*(worker(i) for i in range(6)))

        clock.run(main())
        return order

    assert once() == once()


def test_virtual_wait_times_out_or_sees_the_event():
    clock = VirtualClock()

    async def main():
        ev = asyncio.Event()
        got = await clock.wait(ev, 5.0)
        t1 = clock.now()

        async def setter():
            await clock.sleep(1.0)
            ev.set()

        asyncio.get_running_loop().create_task(setter())
        ev.clear()
        got2 = await clock.wait(ev, 10.0)
        return got, t1, got2, clock.now()

    assert clock.run(main()) == (False, 5.0, True, 6.0)


def test_real_clock_is_monotonic_and_sleeps():
    clock = RealClock()

    async def main():
        a = clock.now()
        await clock.sleep(0.01)
        return clock.now() - a

    assert clock.run(main()) >= 0.009
