"""A one-rank trainer group binds no port, so a port another process took cannot stop it."""

import socket

import torch
import torch.distributed as dist

from slime.train.process_group import init_default_group


def test_one_rank_group_forms_while_its_port_is_taken():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        init_default_group(device="cpu", rank=0, world_size=1, master_addr="127.0.0.1", master_port=port)
        try:
            assert dist.get_world_size() == 1
            total = torch.tensor([3.0])
            dist.all_reduce(total)
            assert total.item() == 3.0
        finally:
            dist.destroy_process_group()
