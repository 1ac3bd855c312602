"""Worker configuration from flags and GRADWIRE_* variables, checked before any network use."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from gradwire.server.cli.settings import ConfigError
from gradwire.server.cli.worker import build_parser
from gradwire.server.cli.worker_config import worker_config


def cfg(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    args: argparse.Namespace = build_parser().parse_args(argv)
    return worker_config(args, env or {})


BASE = {"GRADWIRE_NAME": "w1", "GRADWIRE_RANK": "1", "GRADWIRE_WORLD_SIZE": "3"}


def test_environment_alone_configures_a_worker() -> None:
    c = cfg([], {**BASE, "GRADWIRE_MASTER_ADDR": "ps", "GRADWIRE_MASTER_PORT": "29501"})
    assert (c.name, c.rank, c.world_size) == ("w1", 1, 3)
    assert c.init_method == "tcp://ps:29501"
    opts = c.backend_options()
    assert opts.init_method == "tcp://ps:29501" and opts.rpc_timeout == 60.0


def test_a_flag_beats_its_variable() -> None:
    c = cfg(["--rank", "2", "--master-addr", "127.0.0.1"], {**BASE, "GRADWIRE_MASTER_ADDR": "x"})
    assert c.rank == 2 and c.init_method == "tcp://127.0.0.1:29500"


def test_a_bad_variable_is_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match=r"\$GRADWIRE_RANK='one': not an integer"):
        cfg([], {**BASE, "GRADWIRE_RANK": "one", "GRADWIRE_MASTER_ADDR": "h"})
    with pytest.raises(ConfigError, match=r"\$GRADWIRE_UNTIL='never': must be one of job, signal"):
        cfg([], {**BASE, "GRADWIRE_MASTER_ADDR": "h", "GRADWIRE_UNTIL": "never"})
    with pytest.raises(ConfigError, match=r"GRADWIRE_TRUST_EVERYTHING='maybe'"):
        cfg([], {**BASE, "GRADWIRE_MASTER_ADDR": "h", "GRADWIRE_TRUST_EVERYTHING": "maybe"})


def test_missing_identity_and_rendezvous_are_reported() -> None:
    with pytest.raises(ConfigError, match=r"missing --name \(or \$GRADWIRE_NAME\)"):
        cfg(["--rank", "0", "--world-size", "1"])
    with pytest.raises(ConfigError, match="no rendezvous"):
        cfg([], BASE)
    with pytest.raises(ConfigError, match="out of range for world size 3"):
        cfg(["--rank", "3"], {**BASE, "GRADWIRE_MASTER_ADDR": "h"})


def test_rank_zero_hosts_the_rendezvous_where_it_listens() -> None:
    c = cfg(["--name", "a", "--rank", "0", "--world-size", "1", "--listen", "127.0.0.1:4000"])
    assert c.init_method == "tcp://127.0.0.1:4000"


def test_peer_list_needs_one_address_per_rank_and_excludes_a_master() -> None:
    env = {**BASE, "GRADWIRE_PEERS": "10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1", "GRADWIRE_TOKEN": "t"}
    assert cfg([], env).init_method == ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]
    with pytest.raises(ConfigError, match="lists 2 addresses but the world size is 3"):
        cfg(["--peers", "a:1,b:2"], BASE)
    with pytest.raises(ConfigError, match="not both"):
        cfg(["--master-addr", "h"], env)


def test_non_loopback_listener_needs_a_token() -> None:
    env = {**BASE, "GRADWIRE_MASTER_ADDR": "10.1.2.3", "GRADWIRE_LISTEN": "0.0.0.0:29500"}
    with pytest.raises(ConfigError, match="without authentication"):
        cfg([], env)
    assert cfg(["--allow-insecure"], env).values["allow_insecure"] is True
    assert cfg([], {**env, "GRADWIRE_TOKEN": "s3cret"}).token == "s3cret"


def test_token_file(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("from-file\n")
    env = {**BASE, "GRADWIRE_MASTER_ADDR": "h", "GRADWIRE_TOKEN_FILE": str(f)}
    assert cfg([], env).token == "from-file"
    # A flag beats a variable, even a token file's.
    assert cfg(["--token", "flag"], env).token == "flag"
    assert cfg(["--token-file", str(f)], {**env, "GRADWIRE_TOKEN": "env"}).token == "from-file"
    (tmp_path / "empty").write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        cfg(["--token-file", str(tmp_path / "empty")], env)
    with pytest.raises(ConfigError, match="no such file"):
        cfg(["--token-file", str(tmp_path / "nope")], env)


def test_tls_files_are_checked(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("y")
    env = {**BASE, "GRADWIRE_MASTER_ADDR": "h"}
    with pytest.raises(ConfigError, match="needs --tls-key"):
        cfg(["--tls-cert", str(cert)], env)
    with pytest.raises(ConfigError, match="no such file"):
        cfg(["--tls-cert", str(cert), "--tls-key", str(tmp_path / "missing")], env)
    with pytest.raises(ConfigError, match="needs --tls-ca"):
        cfg(["--tls-cert", str(cert), "--tls-key", str(key), "--tls-require-client-auth"], env)
    c = cfg([], {**env, "GRADWIRE_TLS_CERT": str(cert), "GRADWIRE_TLS_KEY": str(key)})
    assert c.tls.enabled and c.backend_options().tls_cert == str(cert)


def test_policy_and_timeouts_reach_the_backend_options() -> None:
    env = {
        **BASE,
        "GRADWIRE_MASTER_ADDR": "h",
        "GRADWIRE_ALLOW": "mypkg.*, other.mod:f",
        "GRADWIRE_DENY": "mypkg.secret*",
        "GRADWIRE_RPC_TIMEOUT": "7.5",
        "GRADWIRE_NUM_WORKER_THREADS": "4",
    }
    opts = cfg(["--allow", "third.*"], env).backend_options()
    assert opts.callable_allow == ("third.*",)  # the flag replaces the variable's list
    assert "mypkg.secret*" in opts.callable_deny and "numpy*:*load*" in opts.callable_deny
    assert opts.rpc_timeout == 7.5 and opts.num_worker_threads == 4
    assert cfg([], env).backend_options().callable_allow == ("mypkg.*", "other.mod:f")
    assert opts.use_unix_socket is True
    assert cfg(["--unix-socket", "0"], env).backend_options().use_unix_socket is False
    with pytest.raises(ConfigError, match=r"\$GRADWIRE_UNIX_SOCKET='sometimes'"):
        cfg([], {**env, "GRADWIRE_UNIX_SOCKET": "sometimes"})


def test_names_by_rank() -> None:
    env = {"GRADWIRE_RANK": "1", "GRADWIRE_WORLD_SIZE": "3", "GRADWIRE_MASTER_ADDR": "h"}
    assert cfg([], {**env, "GRADWIRE_NAMES": "ps,trainer1,worker3"}).name == "trainer1"
    assert cfg(["--name", "x"], {**env, "GRADWIRE_NAMES": "ps,trainer1,worker3"}).name == "x"
    with pytest.raises(ConfigError, match="lists 2 names but the world size is 3"):
        cfg([], {**env, "GRADWIRE_NAMES": "ps,trainer1"})
    with pytest.raises(ConfigError, match=r"GRADWIRE_NAMES='bad name'"):
        cfg([], {**env, "GRADWIRE_NAMES": "ps,bad name,w"})
