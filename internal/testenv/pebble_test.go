package testenv

import (
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// fakePebbleEnv makes this test binary a stand-in for Pebble (with
// -config) or its challenge server (without), for TestPebbleStartWaitsForItsManagementAPI.
const fakePebbleEnv = "SEAMLESS_TESTENV_FAKE_PEBBLE"

func TestMain(m *testing.M) {
	if os.Getenv(fakePebbleEnv) == "1" {
		fakePebble()
		return
	}
	os.Exit(m.Run())
}

// fakePebble serves Pebble's directory at once and its management API
// only a second later, as Pebble may when its goroutine for the second
// listener runs late.
func fakePebble() {
	fs := flag.NewFlagSet("pebble", flag.ContinueOnError)
	config := fs.String("config", "", "")
	fs.String("dnsserver", "", "")
	_ = fs.Parse(os.Args[1:])
	if *config == "" { // the challenge server: live until stopped
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		return
	}
	b, err := os.ReadFile(*config)
	if err != nil {
		os.Exit(1)
	}
	var c struct {
		Pebble struct{ ListenAddress, ManagementListenAddress, Certificate, PrivateKey string }
	}
	if json.Unmarshal(b, &c) != nil {
		os.Exit(1)
	}
	cert, _ := os.ReadFile(c.Pebble.Certificate)
	serve := func(addr, path string, body []byte) {
		mux := http.NewServeMux()
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) { w.Write(body) })
		_ = http.ListenAndServeTLS(addr, c.Pebble.Certificate, c.Pebble.PrivateKey, mux)
		os.Exit(1)
	}
	go func() {
		time.Sleep(time.Second)
		serve(c.Pebble.ManagementListenAddress, "/roots/0", cert)
	}()
	serve(c.Pebble.ListenAddress, "/dir", []byte("{}"))
}

// Pebble answers its directory before its management API: Start waits
// for both, so that Roots right after it finds the API listening (a CI
// run failed on "connection refused" there).
func TestPebbleStartWaitsForItsManagementAPI(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakePebbleEnv, "1")
	t.Setenv("SEAMLESS_PEBBLE_BIN", self)
	t.Setenv("SEAMLESS_CHALLTESTSRV_BIN", self)
	p := Pebble(t, PebbleOptions{})
	p.Roots()
	p.Stop()
	p.Start()
	p.Roots()
}
