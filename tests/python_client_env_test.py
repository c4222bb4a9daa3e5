#!/usr/bin/env python3
"""Client settings from the environment (KFORGE_SERVER, KFORGE_BUNDLE,
KFORGE_LOCAL_COPY_DIR, KFORGE_TLS_CA, KFORGE_TLS_CERT, KFORGE_TLS_KEY,
KFORGE_TOKEN, KFORGE_TOKEN_FILE) through the Python package and the CLI:
kforge.Client() and kforge.default_source() built from them reach a real
`kforge serve` on loopback that wants TLS, a client certificate and a
bearer token; arguments win over them; every bad setting is an error
naming its variable. The rule is C++ (runtime/client_settings.h, reached
through the C ABI); tests/client_settings_test.cc tests it case by case.

Usage: python_client_env_test.py PATH/TO/kforge PYTHON_DIR
(PYTHON_DIR holds the kforge package with its generated kforge/v1 modules
and its native library kforge/_native/libkforge_capi.so.)
"""
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import unittest.mock

KFORGE, PYTHON_DIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, PYTHON_DIR)

import kforge  # noqa: E402
from kforge import _capi  # noqa: E402
from kforge import ops  # noqa: E402
from kforge.testing import start_server, stop_server  # noqa: E402

ARCH = "sm_90a"
VARIABLES = ("KFORGE_SERVER", "KFORGE_BUNDLE", "KFORGE_TRUST", "KFORGE_LOCAL_COPY_DIR",
             "KFORGE_TLS_CA", "KFORGE_TLS_CERT", "KFORGE_TLS_KEY", "KFORGE_TOKEN",
             "KFORGE_TOKEN_FILE", "KFORGE_FIRST_ANSWER")


def openssl(*args):
    subprocess.run(("openssl",) + args, check=True, capture_output=True)


def clean_environ():
    """os.environ without the client variables (they may be set where the
    test runs)."""
    return {k: v for k, v in os.environ.items() if k not in VARIABLES}


@contextlib.contextmanager
def environment(**variables):
    """The process environment (os.environ, which the C library's getenv
    sees) with exactly these client variables set; restored after."""
    with unittest.mock.patch.dict(os.environ):
        for name in VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(variables)
        yield


class EnvironmentTest(unittest.TestCase):
    """A server with TLS, a required client certificate (mTLS) and a token
    file; certificates made by the openssl CLI at run time."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kforge_pyenv_")
        p = lambda name: os.path.join(cls.tmp, name)  # noqa: E731
        cls.p = staticmethod(p)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=kforge env ca",
                "-keyout", p("ca.key"), "-out", p("ca.pem"))
        with open(p("server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        with open(p("client.ext"), "w") as f:
            f.write("extendedKeyUsage=clientAuth\n")
        for name, subject in (("server", "/CN=localhost"), ("client", "/CN=engine")):
            openssl("req", *ec, "-subj", subject, "-keyout", p(f"{name}.key"),
                    "-out", p(f"{name}.csr"))
            openssl("x509", "-req", "-in", p(f"{name}.csr"), "-CA", p("ca.pem"),
                    "-CAkey", p("ca.key"), "-CAcreateserial", "-days", "1",
                    "-extfile", p(f"{name}.ext"), "-out", p(f"{name}.pem"))
        cls.token = "env-" + os.urandom(16).hex()
        with open(p("tokens"), "w") as f:
            f.write(cls.token + "\n")
        for secret in ("tokens", "server.key"):  # the server refuses secrets others can read
            os.chmod(p(secret), 0o600)
        cls.proc, cls.address = start_server(
            KFORGE, p("cache"), p("server.log"), env=clean_environ(),
            args=("--workers", "1", "--tls-cert", p("server.pem"), "--tls-key", p("server.key"),
                  "--tls-client-ca", p("ca.pem"), "--auth-token-file", p("tokens")))

    @classmethod
    def tearDownClass(cls):
        try:
            assert stop_server(cls.proc) == 0, "kforge serve did not exit cleanly on SIGTERM"
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        ops._default_source = None

    def tearDown(self):
        ops._default_source = None

    def secure(self, **overrides):
        """The variables that reach the server, with overrides (None: unset)."""
        p = self.p
        variables = {"KFORGE_SERVER": self.address, "KFORGE_TLS_CA": p("ca.pem"),
                     "KFORGE_TLS_CERT": p("client.pem"), "KFORGE_TLS_KEY": p("client.key"),
                     "KFORGE_TOKEN_FILE": p("tokens")}
        variables.update(overrides)
        return {k: v for k, v in variables.items() if v is not None}

    def fetch(self, source):
        manifest = source.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        self.assertEqual(manifest.arch, ARCH)
        return manifest

    def refused(self, client):
        with self.assertRaises(kforge.KforgeError) as cm:
            client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        return cm.exception

    # ------------------------------------------------------------ reaching it

    def test_client_from_the_environment(self):
        with environment(**self.secure()):
            with kforge.Client(max_attempts=2) as client:
                self.assertEqual(client.address, self.address)
                self.assertTrue(client.tls)
                self.fetch(client)
        with environment(**self.secure(KFORGE_TOKEN_FILE=None, KFORGE_TOKEN=self.token)):
            with kforge.Client(max_attempts=2) as client:
                self.fetch(client)

    def test_first_answer_from_the_environment(self):
        for value, want in (("1", True), ("on", True), ("0", False), (None, False)):
            with environment(**self.secure(KFORGE_FIRST_ANSWER=value)):
                with kforge.Client(max_attempts=2) as client:
                    self.assertEqual(client.first_answer, want, value)
        with environment(**self.secure(KFORGE_FIRST_ANSWER="1")):
            with kforge.Client(max_attempts=2, first_answer=False) as client:
                self.assertFalse(client.first_answer)  # an argument wins
        with environment(**self.secure(KFORGE_FIRST_ANSWER="sometimes")):
            with self.assertRaises(kforge.KforgeError) as cm:
                kforge.Client(max_attempts=2)
            self.assertIn("KFORGE_FIRST_ANSWER", str(cm.exception))

    def test_the_variables_are_what_the_server_sees(self):
        # Each setting is really used: without the token, or with another,
        # the server refuses; without the client certificate the handshake
        # fails.
        for overrides in ({"KFORGE_TOKEN_FILE": None},
                          {"KFORGE_TOKEN_FILE": None, "KFORGE_TOKEN": "wrong-" + self.token}):
            with environment(**self.secure(**overrides)):
                with kforge.Client(max_attempts=1) as client:
                    error = self.refused(client)
                    self.assertIsInstance(error, kforge.KforgeRpcError)
                    self.assertEqual(error.code_name, "UNAUTHENTICATED")
        with environment(**self.secure(KFORGE_TLS_CERT=None, KFORGE_TLS_KEY=None)):
            with kforge.Client(max_attempts=1, timeout=10) as client:
                self.assertIsInstance(self.refused(client), kforge.KforgeUnavailable)

    def test_default_source_from_the_environment_with_a_local_copy(self):
        copy = self.p("copy")
        with environment(**self.secure(KFORGE_LOCAL_COPY_DIR=copy)):
            source = kforge.default_source()
            self.assertIsInstance(source, kforge.Client)
            self.assertTrue(source.tls)
            manifest = self.fetch(source)
            source.get_kernel(manifest.variants[0], ARCH)
        # The local copy is a bundle the engine can run from offline.
        ops._default_source = None
        with environment(KFORGE_BUNDLE=copy, KFORGE_TLS_CA=self.p("ca.pem")):
            source = kforge.default_source()
            self.assertIsInstance(source, kforge.Bundle)
            self.assertEqual(self.fetch(source), manifest)

    def test_a_signed_bundle_from_the_environment(self):
        p = self.p
        for name in ("signer", "other"):
            subprocess.run([KFORGE, "keygen", "--out", p(name)], check=True, capture_output=True)
        with open(p("one.json"), "w") as f:
            f.write('{"models": [{"preset": "glm-5", "tp": [8]}], "archs": ["%s"]}' % ARCH)
        subprocess.run([KFORGE, "prebuild", p("one.json"), "--out", p("signed"), "-j", "1",
                        "--sign", p("signer.key")], check=True, capture_output=True)
        with environment(KFORGE_BUNDLE=p("signed"), KFORGE_TRUST=p("signer.pub")):
            ops._default_source = None
            source = kforge.default_source()
            self.assertIsInstance(source, kforge.Bundle)
            self.fetch(source)
        # Signed by another key, or not signed at all: refused, naming the
        # variables.
        with environment(KFORGE_BUNDLE=p("signed"), KFORGE_TRUST=p("other.pub")):
            ops._default_source = None
            with self.assertRaises(kforge.KforgeError) as cm:
                kforge.default_source()
            self.assertIn("is not a signature", str(cm.exception))
        os.makedirs(p("unsigned"), exist_ok=True)
        subprocess.run([KFORGE, "prebuild", p("one.json"), "--out", p("unsigned"), "-j", "1"],
                       check=True, capture_output=True)
        with environment(KFORGE_BUNDLE=p("unsigned"), KFORGE_TRUST=p("signer.pub")):
            ops._default_source = None
            with self.assertRaises(kforge.KforgeError) as cm:
                kforge.default_source()
            self.assertIn("is not signed", str(cm.exception))
        # A trust key checks bundles: given for a server, it is an error;
        # KFORGE_TRUST (also `kforge serve --trust`) is not read for one.
        with environment(KFORGE_TRUST=p("signer.pub")):
            self.assertEqual(_capi.client_settings({"address": "h:1"})["trust"], "")
            with self.assertRaises(kforge.KforgeInvalidArgument) as cm:
                _capi.client_settings({"address": "h:1", "trust": p("signer.pub")})
            self.assertIn("trust: a trust key checks a bundle's signature", str(cm.exception))
        ops._default_source = None

    def test_arguments_win_over_the_environment(self):
        p = self.p
        bad = dict(KFORGE_SERVER="127.0.0.1:1", KFORGE_TLS_CA=p("client.key"),
                   KFORGE_TLS_CERT=p("ca.pem"), KFORGE_TLS_KEY=p("client.key"),
                   KFORGE_TOKEN="wrong-" + self.token)
        with environment(**bad):
            with kforge.Client(self.address, tls_ca=p("ca.pem"), tls_cert=p("client.pem"),
                               tls_key=p("client.key"), token_file=p("tokens"),
                               max_attempts=2) as client:
                self.fetch(client)
        # configure()'s server, its own arguments first.
        with environment(**self.secure(KFORGE_TOKEN_FILE=None)):
            source = kforge.configure(address=self.address, token=self.token)
            self.fetch(source)

    def test_cli_client_commands_from_the_environment(self):
        env = {**clean_environ(), **self.secure()}
        r = subprocess.run([KFORGE, "stats"], env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('"compiles"', r.stdout)
        r = subprocess.run([KFORGE, "get", "--preset", "glm-5", "--tp", "8", "--arch", ARCH,
                            "-o", self.p("get")],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(any(f.endswith(".cubin") for f in os.listdir(self.p("get"))))
        # A flag wins over its variable.
        env["KFORGE_TOKEN_FILE"] = self.p("client.key")  # no token in it
        r = subprocess.run([KFORGE, "stats", "--token-file", self.p("tokens")], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run([KFORGE, "stats"], env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("KFORGE_TOKEN_FILE " + self.p("client.key"), r.stderr)
        del env["KFORGE_TLS_KEY"]
        r = subprocess.run([KFORGE, "stats"], env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("KFORGE_TLS_CERT is set without KFORGE_TLS_KEY", r.stderr)

    # ----------------------------------------------------------- bad settings

    def assert_names(self, variables, exception, *needles, source=False):
        """Client() (or default_source()) in `variables` raises `exception`
        whose message holds every needle."""
        with environment(**variables):
            with self.assertRaises(exception) as cm:
                kforge.default_source() if source else kforge.Client()
        for needle in needles:
            self.assertIn(needle, str(cm.exception))

    def test_each_bad_setting_names_its_variable(self):
        p = self.p
        token = self.token
        tls = {"KFORGE_TLS_CA": p("ca.pem")}
        invalid = kforge.KforgeInvalidArgument  # a ValueError
        cases = [
            ({"KFORGE_TOKEN": token}, invalid,
             "KFORGE_TOKEN is set but the connection is not TLS", "set KFORGE_TLS_CA"),
            ({"KFORGE_TOKEN_FILE": p("tokens")}, invalid,
             "KFORGE_TOKEN_FILE is set but the connection is not TLS", "set KFORGE_TLS_CA"),
            ({**tls, "KFORGE_TLS_CERT": p("client.pem")}, invalid,
             "KFORGE_TLS_CERT is set without KFORGE_TLS_KEY"),
            ({**tls, "KFORGE_TLS_KEY": p("client.key")}, invalid,
             "KFORGE_TLS_KEY is set without KFORGE_TLS_CERT"),
            ({**tls, "KFORGE_TOKEN": token, "KFORGE_TOKEN_FILE": p("tokens")}, invalid,
             "both KFORGE_TOKEN and KFORGE_TOKEN_FILE are set"),
            ({**tls, "KFORGE_TOKEN_FILE": self.tmp}, kforge.KforgeError,
             f"KFORGE_TOKEN_FILE: {self.tmp}: is a directory, expected a regular file"),
            ({**tls, "KFORGE_TOKEN_FILE": p("missing")}, kforge.KforgeError,
             "KFORGE_TOKEN_FILE: ", p("missing")),
            ({**tls, "KFORGE_TOKEN": "short"}, invalid, "KFORGE_TOKEN: line 1"),
            ({"KFORGE_TLS_CA": p("missing.pem")}, kforge.KforgeError, "KFORGE_TLS_CA: "),
            ({"KFORGE_TLS_CA": p("ca.key")}, invalid,
             f"KFORGE_TLS_CA {p('ca.key')}: no PEM certificate in it"),
            ({**tls, "KFORGE_TLS_CERT": p("client.pem"), "KFORGE_TLS_KEY": p("server.key")},
             invalid, "KFORGE_TLS_CERT", "KFORGE_TLS_KEY",
             "the private key is not the certificate's key"),
            ({"KFORGE_LOCAL_COPY_DIR": p("ca.pem")}, kforge.KforgeError,
             f"KFORGE_LOCAL_COPY_DIR: {p('ca.pem')}: not a directory"),
        ]
        for variables, exception, *needles in cases:
            with self.subTest(variables=variables):
                self.assert_names(variables, exception, *needles)
                # The default source (what the vLLM plugin uses) says the same.
                ops._default_source = None
                self.assert_names(variables, exception, *needles, source=True)

    def test_bad_sources_name_their_variables(self):
        self.assert_names({"KFORGE_BUNDLE": self.tmp, "KFORGE_SERVER": self.address},
                          kforge.KforgeInvalidArgument,
                          f"both KFORGE_BUNDLE ({self.tmp}) and KFORGE_SERVER", source=True)
        self.assert_names({"KFORGE_BUNDLE": self.p("missing")}, kforge.KforgeNotFound,
                          f"KFORGE_BUNDLE: {self.p('missing')}: no such directory", source=True)

    def test_arguments_are_named_by_their_keyword(self):
        p = self.p
        with environment():
            with self.assertRaises(ValueError) as cm:
                kforge.Client(self.address, token=self.token)  # never in plain text
            self.assertIn("token is set but the connection is not TLS", str(cm.exception))
            self.assertIn("set KFORGE_TLS_CA (or give tls_ca)", str(cm.exception))
            with self.assertRaises(ValueError) as cm:
                kforge.Client(self.address, tls_ca=p("ca.pem"), tls_cert=p("client.pem"))
            self.assertIn("tls_cert is set without tls_key", str(cm.exception))
            with self.assertRaises(kforge.KforgeError) as cm:
                kforge.Client(self.address, tls_ca=p("missing.pem"))
            self.assertIn("tls_ca: ", str(cm.exception))
            with self.assertRaises(ValueError) as cm:
                kforge.Client(self.address, tls_ca=p("ca.pem"), token=self.token,
                              token_file=p("tokens"))
            self.assertIn("both token and token_file are set", str(cm.exception))
        # What the C ABI refuses outright.
        for given in ('{"tls_ca": 3}', '{"nope": "x"}', "[]", "{"):
            with self.subTest(given=given):
                with self.assertRaises(kforge.KforgeInvalidArgument):
                    _capi.call("client_settings", given.encode(), 0, strings_out=1)

    def test_the_settings_the_c_abi_resolves(self):
        p = self.p
        with environment(**self.secure(KFORGE_LOCAL_COPY_DIR=p("later"))):
            s = _capi.client_settings({})
        with open(p("ca.pem")) as f:
            ca = f.read()
        with open(p("client.pem")) as f:
            cert = f.read()
        with open(p("client.key")) as f:
            key = f.read()
        self.assertEqual(s, {"server": self.address, "bundle": "", "trust": "",
                             "local_copy_dir": p("later"), "first_answer": "",
                             "tls": True, "root_certificates": ca, "certificate_chain": cert,
                             "private_key": key, "token": self.token})
        with environment(KFORGE_BUNDLE=self.tmp, KFORGE_TOKEN=self.token):
            s = _capi.client_settings({}, allow_bundle=True)
            self.assertEqual((s["bundle"], s["server"], s["tls"], s["token"]),
                             (self.tmp, "", False, ""))
            s = _capi.client_settings({"address": "h:1", "tls_ca": p("ca.pem")},
                                      allow_bundle=True)
            self.assertEqual((s["bundle"], s["server"], s["token"]), ("", "h:1", self.token))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
