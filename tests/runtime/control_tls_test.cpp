// Mutual TLS on the control plane: a job's keys, how they travel, and a server that takes calls
// only from a process with a certificate of its CA (refused at the handshake, nothing changed).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "dsgd/common/error.h"
#include "control/driver_service.h"
#include "control/store_service.h"
#include "control/tls.h"

namespace dsgd::control {
namespace {

using std::chrono::milliseconds;

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("dsgd-tls-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(Tls, JobKeysTravelAsOneLineAndComeBackTheSame) {
  const TlsKeys keys = make_job_keys();
  ASSERT_TRUE(keys.enabled());
  EXPECT_NE(keys.ca.find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(keys.key.find("PRIVATE KEY"), std::string::npos);
  const std::string line = encode_keys(keys);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const TlsKeys back = decode_keys(line);
  EXPECT_EQ(back.ca, keys.ca);
  EXPECT_EQ(back.cert, keys.cert);
  EXPECT_EQ(back.key, keys.key);
  EXPECT_FALSE(decode_keys("").enabled());
  EXPECT_THROW(decode_keys("not-keys"), ConfigError);
  EXPECT_THROW(decode_keys("a.b.c"), ConfigError);
  EXPECT_NE(make_job_keys().ca, keys.ca);  // a CA per job
}

TEST(Tls, FilesAreCheckedAgainstEachOther) {
  const std::string dir = temp_dir("files");
  const TlsKeys keys = make_job_keys();
  write_keys(keys, dir);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/key.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const TlsKeys loaded = load_keys(dir + "/ca.pem", dir + "/cert.pem", dir + "/key.pem");
  EXPECT_EQ(loaded.cert, keys.cert);

  const TlsKeys other = make_job_keys();
  write_keys(other, dir + "/other");
  try {
    load_keys(dir + "/ca.pem", dir + "/other/cert.pem", dir + "/other/key.pem");
    FAIL() << "a certificate of another CA was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not signed by the CA"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_keys(dir + "/ca.pem", dir + "/cert.pem", dir + "/other/key.pem"), ConfigError);  // not its key
  try {
    load_keys(dir + "/ca.pem", dir + "/missing.pem", dir + "/key.pem");
    FAIL() << "a missing file was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.pem (no such file)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_keys(dir + "/key.pem", dir + "/cert.pem", dir + "/key.pem"), ConfigError);  // not a certificate
  std::filesystem::remove_all(dir);
}

class TlsStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StoreServer::start(comm::make_memory_store(), "127.0.0.1:0", "tok", keys_);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::shared_ptr<comm::Store> client(const TlsKeys& keys) {
    StoreClientOptions o;
    o.rpc_timeout = milliseconds(3000);
    o.tls = keys;
    return connect_store(address_, "tok", o);
  }
  // The error a client with `keys` gets for one call.
  std::string refusal(const TlsKeys& keys) {
    try {
      client(keys)->set("k", "intruder");
      return "";
    } catch (const CommError& e) {
      return e.what();
    }
  }
  const TlsKeys keys_ = make_job_keys();
  std::unique_ptr<StoreServer> server_;
  std::string address_;
};

TEST_F(TlsStoreTest, AMemberIsServed) {
  auto store = client(keys_);
  store->set("k", "v");
  EXPECT_EQ(store->get("k", milliseconds(1000)), "v");
}

TEST_F(TlsStoreTest, AnotherCasCertificateOrNoneIsRefusedAtTheHandshake) {
  client(keys_)->set("k", "v");
  const std::string other = refusal(make_job_keys());
  std::cout << "another CA: " << other << "\n";
  EXPECT_NE(other.find("TLS handshake"), std::string::npos) << other;
  const std::string plain = refusal({});
  std::cout << "no TLS: " << plain << "\n";
  EXPECT_NE(plain.find("--tls"), std::string::npos) << plain;
  // Trusting the server's CA is not enough: the server checks the client's certificate too.
  const std::string no_cert = refusal({keys_.ca, "", ""});
  std::cout << "no certificate: " << no_cert << "\n";
  EXPECT_FALSE(no_cert.empty());
  const TlsKeys stranger = make_job_keys();
  const std::string other_cert = refusal({keys_.ca, stranger.cert, stranger.key});
  std::cout << "another CA's certificate: " << other_cert << "\n";
  EXPECT_FALSE(other_cert.empty());
  EXPECT_EQ(client(keys_)->get("k", milliseconds(1000)), "v");  // nothing changed
  EXPECT_EQ(server_->rejected_calls(), 0);                        // no call got as far as the token
}

TEST(Tls, DriverAndWorkerMeetOverTls) {
  DriverServerOptions o;
  o.tls = make_job_keys();
  o.token = "tok";
  auto server = DriverServer::start(o);
  DriverClient worker("127.0.0.1:" + std::to_string(server->port()), "tok", o.tls);
  const auto reg = worker.register_worker("h", "127.0.0.1", 1, -1, milliseconds(5000));
  EXPECT_EQ(reg.worker, 0);
  DriverClient stranger("127.0.0.1:" + std::to_string(server->port()), "tok", make_job_keys());
  EXPECT_THROW(stranger.register_worker("h", "127.0.0.1", 2, -1, milliseconds(1000)), CommError);
  EXPECT_EQ(server->alive().size(), 1u);
}

}  // namespace
}  // namespace dsgd::control
