"""Batched reinforcement learning with ``async_execution`` (after PyTorch's "Implementing Batch
RPC Processing Using Asynchronous Executions" tutorial). One agent holds the policy; each
observer runs an environment and asks the agent for actions. The agent answers the observers of
one step together: it waits until all have asked, runs the policy once on the stacked states,
and completes every observer's future from that one batch.

The environment is synthetic (nothing to download): a state of 4 numbers, and a reward of 1 when
the action is 1 exactly when the state's first number is positive.

    python examples/rpc_tutorials/batched_rl.py

Prints how many batched policy calls served how many actions, and the mean reward of the first
and last episodes; exits non-zero if the batched path was not taken or the reward did not rise.
"""

import sys
import threading

from _framework import Categorical, F, futures, launch, nn, optim, rpc, torch

OBSERVERS, STEPS, EPISODES, STATE = 3, 10, 30, 4
AGENT_NAME, OBSERVER_NAME = "agent", "observer{}"


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(STATE, 32)
        self.dropout = nn.Dropout(p=0.1)
        self.affine2 = nn.Linear(32, 2)

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        return F.softmax(self.affine2(x), dim=1)


class SyntheticEnv:
    def __init__(self, seed):
        self.generator_seed = seed
        self.state = None

    def reset(self):
        self.state = torch.randn(STATE)
        return self.state

    def step(self, action):
        reward = 1.0 if action == int(self.state[0].item() > 0) else 0.0
        self.state = torch.randn(STATE)
        return self.state, reward


class Observer:
    def __init__(self, rank):
        self.id = rank
        torch.manual_seed(rank)
        self.env = SyntheticEnv(rank)

    def run_episode(self, agent_rref, n_steps):
        state, ep_reward = self.env.reset(), 0.0
        rewards = torch.zeros(n_steps)
        for step in range(n_steps):
            action = rpc.rpc_sync(
                agent_rref.owner(),
                Agent.select_action_batch,
                args=(agent_rref, self.id, state),
            )
            state, reward = self.env.step(action)
            rewards[step] = reward
            ep_reward += reward
        return [rewards, ep_reward]


class Agent:
    def __init__(self, world_size):
        torch.manual_seed(0)
        self.ob_rrefs = []
        self.agent_rref = rpc.RRef(self)
        self.rewards = {}
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=3e-2)
        self.running_reward = 0
        self.batches = 0
        self.batched_actions = 0
        for ob_rank in range(1, world_size):
            ob_info = rpc.get_worker_info(OBSERVER_NAME.format(ob_rank))
            self.ob_rrefs.append(rpc.remote(ob_info, Observer, args=(ob_rank,)))
            self.rewards[ob_rank] = []
        self.states = torch.zeros(len(self.ob_rrefs), STATE)
        self.saved_log_probs = []
        self.future_actions = futures.Future()
        self.lock = threading.Lock()
        self.pending_states = len(self.ob_rrefs)

    @staticmethod
    @rpc.functions.async_execution
    def select_action_batch(agent_rref, ob_id, state):
        self = agent_rref.local_value()
        self.states[ob_id - 1].copy_(state)
        future_action = self.future_actions.then(
            lambda future_actions: future_actions.wait()[ob_id - 1].item()
        )
        with self.lock:
            self.pending_states -= 1
            if self.pending_states == 0:
                self.pending_states = len(self.ob_rrefs)
                probs = self.policy(self.states.clone())
                m = Categorical(probs)
                actions = m.sample()
                self.saved_log_probs.append(m.log_prob(actions))
                self.batches += 1
                self.batched_actions += actions.numel()
                future_actions = self.future_actions
                self.future_actions = futures.Future()
                future_actions.set_result(actions)
        return future_action

    def run_episode(self, n_steps):
        futs = [
            ob_rref.rpc_async().run_episode(self.agent_rref, n_steps) for ob_rref in self.ob_rrefs
        ]
        rets = futures.wait_all(futs)
        rewards = torch.stack([ret[0] for ret in rets]).t()  # (steps, observers)
        return sum(ret[1] for ret in rets) / len(rets), rewards

    def finish_episode(self, rewards):
        log_probs = torch.stack(self.saved_log_probs)  # (steps, observers)
        advantages = rewards - rewards.mean()
        loss = -(log_probs * advantages).sum() / rewards.shape[1]
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.saved_log_probs = []


def run_worker(rank, world_size):
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=120)
    name = AGENT_NAME if rank == 0 else OBSERVER_NAME.format(rank)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    good = True
    if rank == 0:
        agent = Agent(world_size)
        mean_rewards = []
        for _ in range(EPISODES):
            mean_reward, rewards = agent.run_episode(STEPS)
            agent.finish_episode(rewards)
            mean_rewards.append(mean_reward / STEPS)
        first, last = sum(mean_rewards[:5]) / 5, sum(mean_rewards[-5:]) / 5
        per_batch = agent.batched_actions / agent.batches
        good = per_batch == OBSERVERS and last > first and last > 0.7
        print(f"{agent.batches} batched policy calls served {agent.batched_actions} actions")
        print(
            f"mean reward per step rose from {first:.2f} to {last:.2f}"
            if good
            else f"FAILED: reward {first:.2f} -> {last:.2f}, {per_batch} actions per batch"
        )
    rpc.shutdown()
    if not good:
        sys.exit(1)


if __name__ == "__main__":
    launch(run_worker, OBSERVERS + 1)
