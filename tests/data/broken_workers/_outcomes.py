"""A worker whose outcomes are edited before they are sent (the general path, as faults take)."""
from _base import MsgType, Worker, wire


class EditsOutcomes(Worker):
    def edit(self, step, outcomes):
        return outcomes

    def answer(self, plan):
        plan = wire.plan_of(plan)
        outcomes = self.edit(plan.step, self.executor.verdicts(plan).outcomes)
        frames = self.result_frames(plan.step, wire.encode_body(MsgType.RESULT, outcomes),
                                    [item.num_tokens for item in plan.items])
        self.sock.send_multipart(frames)
        self.executor.apply(plan)
