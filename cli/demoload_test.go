package cli_test

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/internal/loopnet"
)

// TestDemoLoad: demo-load against demo-web counts its requests and none
// fails; against a port nobody listens on, every request fails and it says
// so; flags out of bounds are refused before any request.
func TestDemoLoad(t *testing.T) {
	base, _, _ := demoWeb(t, map[string]string{"GREETING": "hello"})
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	resp := waitServing(t, client, base+"/")
	resp.Body.Close()
	run := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := cli.Run(context.Background(), append([]string{"demo-load"}, args...), strings.NewReader(""), &out, &errOut)
		return code, out.String() + errOut.String()
	}

	code, out := run("--duration", "1s", "--rate", "50", "--clients", "2", base+"/")
	if code != 0 || !strings.Contains(out, " 0 failed") || !strings.Contains(out, `"hello" ×`) {
		t.Errorf("against demo-web: exit %d:\n%s", code, out)
	}

	port, err := loopnet.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	code, out = run("--duration", "300ms", "--rate", "20", "--clients", "1", "http://127.0.0.1:"+strconv.Itoa(port)+"/")
	if code == 0 || !strings.Contains(out, "requests failed") || !strings.Contains(out, "connection refused") {
		t.Errorf("against a closed port: exit %d:\n%s", code, out)
	}

	for _, args := range [][]string{
		{"--duration", "1001s", base + "/"},
		{"--duration", "101s", "--rate", "2000", base + "/"},
		{"--rate", "2001", base + "/"},
		{"--clients", "257", base + "/"},
		{"--clients", "0", base + "/"},
		{"--duration", "1s", "ftp://127.0.0.1/"},
	} {
		if code, out := run(args...); code == 0 || out == "" {
			t.Errorf("demo-load %v: exit %d, %q", args, code, out)
		}
	}
}
