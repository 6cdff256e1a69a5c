package render_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
)

// Health checks, terminationGracePeriod and rollout strategies (issue 13),
// in the corpus's style: each invalid case is the corpus base with one
// file added, and lists every error with its exact position.

// checksService is a Service web of port 8080 with spec lines added after
// the port (indented 2) and template lines after the image (indented 4).
// Without spec lines the template's own start on line 9.
func checksService(spec, template string) string {
	return "apiVersion: keel/v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  port: 8080\n" + spec +
		"  template:\n    image: base/14.2-web\n" + template
}

// checksJail is a Jail tools with spec lines added after its image
// (indented 2), from line 7.
func checksJail(spec string) string {
	return "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\nspec:\n  image: base/14.2-base\n" + spec
}

// checksReadiness is a template's readiness check written in flow style on
// line 9: its fields start at column 26.
func checksReadiness(fields string) string {
	return "    checks: {readiness: {" + fields + "}}\n"
}

func checksWeb(template string) map[string]string {
	return map[string]string{"apps/web.yaml": checksService("", template)}
}

var checksInvalid = []corpusInvalidCase{
	// Exactly one kind.
	{
		name:  "a check of no kind",
		files: checksWeb("    checks:\n      readiness:\n        period: 10s\n"),
		want:  []corpusDiag{{"apps/web.yaml", 11, 9, "spec.template.checks.readiness", "a check needs one of tcp, http or exec"}},
	},
	{
		name:  "an empty check",
		files: checksWeb("    checks:\n      liveness: {}\n"),
		want:  []corpusDiag{{"apps/web.yaml", 10, 17, "spec.template.checks.liveness", "a check needs one of tcp, http or exec"}},
	},
	{
		name:  "a check of two kinds",
		files: checksWeb(checksReadiness("tcp: {port: 80}, http: {port: 80}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 25, "spec.template.checks.readiness", "tcp and http are both set: a check has exactly one of tcp, http or exec"}},
	},
	{
		name:  "a check of three kinds",
		files: map[string]string{"jails/tools.yaml": checksJail("  checks:\n    startup:\n      tcp: {port: 80}\n      http: {port: 80}\n      exec: {command: [/bin/true]}\n")},
		want:  []corpusDiag{{"jails/tools.yaml", 9, 7, "spec.checks.startup", "tcp, http and exec are all set: a check has exactly one of them"}},
	},
	{
		name:  "a misspelt kind is suggested, and the check has none",
		files: checksWeb("    checks:\n      readiness:\n        htpp: {port: 80}\n"),
		want: []corpusDiag{
			{"apps/web.yaml", 11, 9, "spec.template.checks.readiness", "a check needs one of tcp, http or exec"},
			{"apps/web.yaml", 11, 9, "spec.template.checks.readiness.htpp", `unknown field "htpp" (did you mean "http"?)`},
		},
	},
	{
		name:  "a misspelt check name is suggested",
		files: checksWeb("    checks:\n      readyness: {tcp: {port: 80}}\n"),
		want:  []corpusDiag{{"apps/web.yaml", 10, 7, "spec.template.checks.readyness", `unknown field "readyness" (did you mean "readiness"?)`}},
	},

	// Ports.
	{
		name:  "tcp port 0",
		files: checksWeb(checksReadiness("tcp: {port: 0}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 38, "spec.template.checks.readiness.tcp.port", "0 is not a TCP port (1-65535)"}},
	},
	{
		name:  "http port above 65535",
		files: checksWeb(checksReadiness("http: {port: 70000}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.port", "70000 is not a TCP port (1-65535)"}},
	},
	{
		name:  "a port written as a string",
		files: checksWeb(checksReadiness(`tcp: {port: "80"}`)),
		want:  []corpusDiag{{"apps/web.yaml", 9, 38, "spec.template.checks.readiness.tcp.port", "expected an integer, got the string"}},
	},
	{
		name:  "a Jail's check has no Service port to default to",
		files: map[string]string{"jails/tools.yaml": checksJail("  checks:\n    liveness:\n      tcp: {}\n")},
		want:  []corpusDiag{{"jails/tools.yaml", 9, 12, "spec.checks.liveness.tcp.port", "required: the port to check (only a Service's template defaults it, to the Service's port)"}},
	},

	// http.path, http.host, http.status.
	{
		name:  "http path not starting with /",
		files: checksWeb(checksReadiness("http: {path: healthz}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.path", `"healthz" is not a URL path (want one starting with /, e.g. /healthz)`}},
	},
	{
		name:  "http path with a space",
		files: checksWeb(checksReadiness(`http: {path: "/health check"}`)),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.path", `"/health check" contains a space or a control character (percent-encode it, e.g. %20)`}},
	},
	{
		name:  "http path with a control character",
		files: checksWeb(checksReadiness(`http: {path: "/a\tb"}`)),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.path", `"/a\tb" contains a space or a control character`}},
	},
	{
		name:  "http path with a fragment",
		files: checksWeb(checksReadiness(`http: {path: "/status#top"}`)),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.path", `"/status#top" has a fragment (#...), which is never sent to the server`}},
	},
	{
		name:  "http path with a broken escape",
		files: checksWeb(checksReadiness(`http: {path: "/a%zz"}`)),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.path", `"/a%zz" is not a URL path (a % must start an escape such as %2F)`}},
	},
	{
		name:  "http path longer than 1024 bytes",
		files: checksWeb(checksReadiness("http: {path: /" + strings.Repeat("a", 1024) + "}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.path", "is 1025 bytes long, more than 1024"}},
	},
	{
		name:  "http path written empty",
		files: checksWeb(checksReadiness(`http: {path: ""}`)),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.path", `"" is not allowed: leave the field out to use the default (/)`}},
	},
	{
		name:  "http host with a scheme",
		files: checksWeb(checksReadiness("http: {host: \"https://example.com\"}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.host", `"https://example.com": want a host name without a scheme, e.g. app.example.com`}},
	},
	{
		name:  "http host with a port",
		files: checksWeb(checksReadiness("http: {host: \"example.com:8080\"}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.host", `"example.com:8080": want a host name without a port (the port is http.port)`}},
	},
	{
		name:  "http host with a path",
		files: checksWeb(checksReadiness("http: {host: example.com/x}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.host", `"example.com/x": want a host name without a path (the path is http.path)`}},
	},
	{
		name:  "http host not a DNS name",
		files: checksWeb(checksReadiness("http: {host: Web_App}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.host", `"Web_App" is not a valid host name (lowercase letters, digits, '-' and dots)`}},
	},
	{
		name:  "http host an IPv6 address",
		files: checksWeb(checksReadiness(`http: {host: "::1"}`)),
		want:  []corpusDiag{{"apps/web.yaml", 9, 39, "spec.template.checks.readiness.http.host", `"::1": only IPv4 addresses are supported`}},
	},
	{
		name:  "http status above 599",
		files: checksWeb(checksReadiness("http: {status: 600}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 41, "spec.template.checks.readiness.http.status", `"600": an HTTP status is from 100 to 599`}},
	},
	{
		name:  "http status range below 100",
		files: checksWeb(checksReadiness("http: {status: 99-200}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 41, "spec.template.checks.readiness.http.status", `"99-200": an HTTP status is from 100 to 599`}},
	},
	{
		name:  "http status range upside down",
		files: checksWeb(checksReadiness("http: {status: 399-200}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 41, "spec.template.checks.readiness.http.status", `"399-200" is an empty range: 399 is more than 200`}},
	},
	{
		name:  "http status not a status",
		files: checksWeb(checksReadiness("http: {status: 2xx}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 41, "spec.template.checks.readiness.http.status", `"2xx" is not an HTTP status or range of statuses (want e.g. 200, or 200-399)`}},
	},

	// exec.
	{
		name:  "exec without a command",
		files: checksWeb(checksReadiness("exec: {}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 32, "spec.template.checks.readiness.exec.command", "required: the command to run inside the instance, as a list (argv)"}},
	},
	{
		name:  "exec with an empty command",
		files: checksWeb(checksReadiness("exec: {command: []}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 42, "spec.template.checks.readiness.exec.command", "required: the command to run inside the instance"}},
	},
	{
		name:  "exec with an empty program and a NUL byte",
		files: checksWeb(checksReadiness(`exec: {command: ["", "a\0b"]}`)),
		want: []corpusDiag{
			{"apps/web.yaml", 9, 43, "spec.template.checks.readiness.exec.command[0]", "the program to run must not be empty"},
			{"apps/web.yaml", 9, 47, "spec.template.checks.readiness.exec.command[1]", "contains a NUL byte"},
		},
	},
	{
		name:  "exec command a string",
		files: checksWeb(checksReadiness("exec: {command: /bin/check}")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 42, "spec.template.checks.readiness.exec.command", "expected a list, got the string"}},
	},

	// Timing and thresholds.
	{
		name:  "period longer than an hour",
		files: checksWeb(checksReadiness("tcp: {}, period: 2h")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 43, "spec.template.checks.readiness.period", "2h0m0s is more than 1h0m0s: a check runs at least once an hour"}},
	},
	{
		name:  "period zero",
		files: checksWeb(checksReadiness("tcp: {}, period: 0s")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 43, "spec.template.checks.readiness.period", `"0s": a duration must be more than zero`}},
	},
	{
		name:  "timeout longer than the period",
		files: checksWeb(checksReadiness("tcp: {}, period: 2s, timeout: 3s")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 56, "spec.template.checks.readiness.timeout", "3s is longer than the period, 2s: a run must end before the next one starts"}},
	},
	{
		name:  "timeout longer than the default period",
		files: checksWeb(checksReadiness("tcp: {}, timeout: 6s")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 44, "spec.template.checks.readiness.timeout", "6s is longer than the period, 5s"}},
	},
	{
		name:  "failureThreshold 0 names the default",
		files: checksWeb(checksReadiness("tcp: {}, failureThreshold: 0")),
		want:  []corpusDiag{{"apps/web.yaml", 9, 53, "spec.template.checks.readiness.failureThreshold", "0 is not allowed: leave the field out to use the default (3)"}},
	},
	{
		name:  "thresholds out of range",
		files: checksWeb(checksReadiness("tcp: {}, successThreshold: 101, failureThreshold: -1")),
		want: []corpusDiag{
			{"apps/web.yaml", 9, 53, "spec.template.checks.readiness.successThreshold", "101 is not a threshold (1-100)"},
			{"apps/web.yaml", 9, 76, "spec.template.checks.readiness.failureThreshold", "-1 is not a threshold (1-100)"},
		},
	},
	{
		name:  "successThreshold above 1 for liveness and startup",
		files: checksWeb("    checks:\n      liveness: {tcp: {}, successThreshold: 2}\n      startup: {tcp: {}, successThreshold: 3}\n      readiness: {tcp: {}, successThreshold: 2}\n"),
		want: []corpusDiag{
			{"apps/web.yaml", 10, 45, "spec.template.checks.liveness.successThreshold", "2: must be 1 for a liveness check, as in Kubernetes (only a readiness check counts passes in a row)"},
			{"apps/web.yaml", 11, 44, "spec.template.checks.startup.successThreshold", "3: must be 1 for a startup check"},
		},
	},

	// terminationGracePeriod.
	{
		name:  "terminationGracePeriod longer than an hour",
		files: map[string]string{"jails/tools.yaml": checksJail("  terminationGracePeriod: 90m\n")},
		want:  []corpusDiag{{"jails/tools.yaml", 7, 27, "spec.terminationGracePeriod", "1h30m0s is more than 1h0m0s"}},
	},
	{
		name:  "terminationGracePeriod zero",
		files: checksWeb("    terminationGracePeriod: 0\n"),
		want:  []corpusDiag{{"apps/web.yaml", 9, 29, "spec.template.terminationGracePeriod", `"0": a duration must be more than zero`}},
	},

	// strategy.
	{
		name:  "maxUnavailable negative",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {maxUnavailable: -1}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 30, "spec.strategy.maxUnavailable", `"-1" must not be negative`}},
	},
	{
		name:  "maxSurge above 100%",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {maxSurge: 150%}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 24, "spec.strategy.maxSurge", `"150%" is more than 100%`}},
	},
	{
		name:  "maxSurge above 10000",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {maxSurge: 10001}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 24, "spec.strategy.maxSurge", `"10001" is more than 10000 replicas`}},
	},
	{
		name:  "maxUnavailable neither a number nor a percentage",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {maxUnavailable: 1.5}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 30, "spec.strategy.maxUnavailable", `"1.5" is not a number of replicas or a percentage of them (want e.g. 1 or 25%)`}},
	},
	{
		name:  "maxUnavailable and maxSurge both written 0",
		files: map[string]string{"apps/web.yaml": checksService("  strategy:\n    maxUnavailable: 0\n    maxSurge: 0%\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 8, 21, "spec.strategy.maxUnavailable", "maxUnavailable and maxSurge are both 0: a rollout could never replace a replica (make one of them more than 0)"}},
	},
	{
		name: "maxSurge on a stateful Service",
		files: map[string]string{"apps/web.yaml": checksService("  replicas: 2\n  strategy: {maxSurge: 1}\n",
			"    volumes: [{name: data, mountPath: /data}]\n")},
		want: []corpusDiag{{"apps/web.yaml", 8, 24, "spec.strategy.maxSurge", "must be 0 for a stateful Service (one with volumes): a stateful replica never surges"}},
	},
	{
		name:  "minReadySeconds out of range",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {minReadySeconds: 3601}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 31, "spec.strategy.minReadySeconds", "3601 is not a number of seconds from 0 to 3600"}},
	},
	{
		name:  "progressDeadline not more than minReadySeconds",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {minReadySeconds: 600, progressDeadline: 10m}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 54, "spec.strategy.progressDeadline", "10m0s is not more than minReadySeconds (10m0s): no replica could become available in time"}},
	},
	{
		name:  "the default progressDeadline not more than minReadySeconds",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {minReadySeconds: 900}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 13, "spec.strategy.progressDeadline", "10m0s is not more than minReadySeconds (15m0s)"}},
	},
	{
		name:  "failureAction in the wrong case suggests the action meant",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {failureAction: Pause}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 29, "spec.strategy.failureAction", `"Pause" is not a failure action (did you mean "pause"?)`}},
	},
	{
		name:  "failureAction unknown",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {failureAction: rollback}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 29, "spec.strategy.failureAction", `"rollback" is not a failure action (want pause or continue)`}},
	},
	{
		name:  "failureAction written empty",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {failureAction: \"\"}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 29, "spec.strategy.failureAction", `"" is not allowed: leave the field out to use the default (pause)`}},
	},
	{
		name:  "a misspelt strategy field is suggested",
		files: map[string]string{"apps/web.yaml": checksService("  strategy: {maxSurg: 1}\n", "")},
		want:  []corpusDiag{{"apps/web.yaml", 7, 14, "spec.strategy.maxSurg", `unknown field "maxSurg" (did you mean "maxSurge"?)`}},
	},
	{
		name:  "strategy in the template is unknown there",
		files: checksWeb("    strategy: {maxSurge: 1}\n"),
		want:  []corpusDiag{{"apps/web.yaml", 9, 5, "spec.template.strategy", `unknown field "strategy"`}},
	},

	// Surge instances share the instance namespace and the cap.
	{
		name: "a Jail named like a surge instance",
		files: map[string]string{
			"apps/web.yaml":    checksService("  replicas: 3\n  strategy: {maxSurge: 1}\n", ""),
			"jails/web-3.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: web-3\nspec:\n  image: base/14.2-base\n",
		},
		want: []corpusDiag{{"apps/web.yaml", 4, 9, "metadata.name", `duplicate name "web-3" (surge instance 0 of Service web): it is also declared at jails/web-3.yaml:4:9`}},
	},
	{
		name: "a surge instance's name too long",
		files: map[string]string{"apps/web.yaml": strings.Replace(checksService("  replicas: 10\n  strategy: {maxSurge: 1}\n", ""),
			"name: web", "name: "+corpusLong("w", 61), 1)},
		want: []corpusDiag{{"apps/web.yaml", 4, 9, "metadata.name", `surge instance name "` + corpusLong("w", 61) + `-10" would be longer than 63 characters`}},
	},
	{
		name: "surge instances count toward the instance cap",
		files: map[string]string{
			"cluster.yaml":  corpusBase["cluster.yaml"] + "  maxInstances: 4\n",
			"apps/web.yaml": checksService("  replicas: 3\n  strategy: {maxSurge: 2}\n", ""),
		},
		want: []corpusDiag{{"apps/web.yaml", 7, 13, "spec.replicas", "3 replicas and 2 surge instances bring the cluster to 5 instances (Jails, Service replicas and surge instances), more than its maxInstances of 4: lower replicas or maxSurge, or raise spec.maxInstances in cluster.yaml (at most 100000)"}},
	},
}

func TestChecksInvalid(t *testing.T) {
	t.Parallel()
	runCorpusInvalid(t, checksInvalid)
}

// checksRender renders files on the corpus base and returns the model.
func checksRender(t *testing.T, files map[string]string) *render.Model {
	t.Helper()
	m, err := render.Render(corpusFS(files, nil))
	if err != nil {
		t.Fatalf("Render() error:\n%v", err)
	}
	return m
}

const sec = render.Duration(time.Second)

var checksValid = []corpusValidCase{
	{
		name:  "a Service replica without a readiness check gets one on the Service's port",
		files: map[string]string{"apps/web.yaml": corpusWeb},
		check: func(t *testing.T, m *render.Model) {
			spec := corpusInstance(t, m, "web-0").Spec
			corpusEqual(t, "Checks", spec.Checks, render.Checks{Readiness: &render.Check{
				TCP: &render.TCPCheck{Port: 8080}, Period: 5 * sec, Timeout: sec, SuccessThreshold: 1, FailureThreshold: 3, Default: true,
			}})
			corpusEqual(t, "TerminationGracePeriod", spec.TerminationGracePeriod, 10*sec)
		},
	},
	{
		name: "defaults of each kind of check; ports default to the Service's",
		files: checksWeb(`    checks:
      startup: {tcp: {}}
      readiness: {http: {}}
      liveness: {exec: {command: [/usr/local/bin/ok, -q]}, period: 500ms}
    terminationGracePeriod: 30s
`),
		check: func(t *testing.T, m *render.Model) {
			spec := corpusInstance(t, m, "web-0").Spec
			corpusEqual(t, "Checks", spec.Checks, render.Checks{
				Startup: &render.Check{TCP: &render.TCPCheck{Port: 8080}, Period: 5 * sec, Timeout: sec, SuccessThreshold: 1, FailureThreshold: 3},
				Readiness: &render.Check{HTTP: &render.HTTPCheck{Port: 8080, Path: "/", StatusMin: 200, StatusMax: 399},
					Period: 5 * sec, Timeout: sec, SuccessThreshold: 1, FailureThreshold: 3},
				// A period below the default timeout brings the timeout down.
				Liveness: &render.Check{Exec: &render.ExecCheck{Command: []string{"/usr/local/bin/ok", "-q"}},
					Period: sec / 2, Timeout: sec / 2, SuccessThreshold: 1, FailureThreshold: 3},
			})
			corpusEqual(t, "TerminationGracePeriod", spec.TerminationGracePeriod, 30*sec)
		},
	},
	{
		name: "every check field written",
		files: map[string]string{"jails/tools.yaml": checksJail(`  checks:
    readiness:
      http: {port: 9000, path: "/healthz?full=1", host: app.example.com, status: 204}
      period: 10s
      timeout: 10s
      successThreshold: 2
      failureThreshold: 100
    liveness:
      http: {port: 9000, host: 10.0.0.1, status: 200-299}
`)},
		check: func(t *testing.T, m *render.Model) {
			c := corpusInstance(t, m, "tools").Spec.Checks
			corpusEqual(t, "Readiness", *c.Readiness, render.Check{
				HTTP:   &render.HTTPCheck{Port: 9000, Path: "/healthz?full=1", Host: "app.example.com", StatusMin: 204, StatusMax: 204},
				Period: 10 * sec, Timeout: 10 * sec, SuccessThreshold: 2, FailureThreshold: 100,
			})
			corpusEqual(t, "Liveness.HTTP", *c.Liveness.HTTP, render.HTTPCheck{Port: 9000, Path: "/", Host: "10.0.0.1", StatusMin: 200, StatusMax: 299})
			corpusEqual(t, "Startup", c.Startup, (*render.Check)(nil))
		},
	},
	{
		name:  "a Service's readiness check as written replaces the default",
		files: checksWeb(checksReadiness("http: {path: /ready}")),
		check: func(t *testing.T, m *render.Model) {
			c := corpusInstance(t, m, "web-0").Spec.Checks
			if c.Readiness == nil || c.Readiness.Default || c.Readiness.HTTP == nil || c.Readiness.HTTP.Path != "/ready" {
				t.Errorf("Readiness = %+v, want the http check as written", c.Readiness)
			}
		},
	},
	{
		name:  "strategy defaults",
		files: map[string]string{"apps/web.yaml": corpusWeb},
		check: func(t *testing.T, m *render.Model) {
			svc := corpusService(t, m, "web")
			corpusEqual(t, "Strategy", svc.Strategy, render.Strategy{MaxUnavailable: 1, ProgressDeadline: 600 * sec, FailureAction: "pause"})
			corpusEqual(t, "Surge", svc.Surge, []string(nil))
			corpusEqual(t, "instances", corpusInstanceNames(m), []string{"web-0"})
		},
	},
	{
		name: "every strategy field written",
		files: map[string]string{"apps/web.yaml": checksService(`  replicas: 4
  strategy:
    maxUnavailable: 0
    maxSurge: 2
    minReadySeconds: 30
    progressDeadline: 31s
    failureAction: continue
`, "")},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "Strategy", corpusService(t, m, "web").Strategy,
				render.Strategy{MaxUnavailable: 0, MaxSurge: 2, MinReadySeconds: 30, ProgressDeadline: 31 * sec, FailureAction: "continue"})
		},
	},
	{
		name: "surge instances follow the replicas",
		files: map[string]string{
			"apps/web.yaml": checksService("  replicas: 3\n  strategy: {maxSurge: 2}\n", "    nodeSelector: {disk: ssd}\n"),
			"apps/db.yaml":  strings.Replace(corpusDB, "  port: 5432\n", "  port: 5432\n  strategy: {maxSurge: 0, maxUnavailable: 1}\n", 1),
			// Surge instances are never stateful, so never pinned: a pin
			// of one is reported as the pin of no stateful instance.
			"keel.lock": "apiVersion: keel/v1\nkind: Lock\npins: {db-0: n1, db-1: n2}\n",
		},
		check: func(t *testing.T, m *render.Model) {
			svc := corpusService(t, m, "web")
			corpusEqual(t, "Instances", svc.Instances, []string{"web-0", "web-1", "web-2"})
			corpusEqual(t, "Surge", svc.Surge, []string{"web-3", "web-4"})
			corpusEqual(t, "Strategy.MaxSurge", svc.Strategy.MaxSurge, 2)
			corpusEqual(t, "instances", corpusInstanceNames(m), []string{"db-0", "db-1", "web-0", "web-1", "web-2", "web-3", "web-4"})
			web0 := corpusInstance(t, m, "web-0")
			for i, name := range []string{"web-3", "web-4"} {
				inst := corpusInstance(t, m, name)
				corpusEqual(t, name+".Surge", inst.Surge, true)
				corpusEqual(t, name+".Index", inst.Index, 3+i)
				corpusEqual(t, name+".Service", inst.Service, "web")
				corpusEqual(t, name+".Stateful", inst.Stateful, false)
				corpusEqual(t, name+".Pin", inst.Pin, "")
				corpusEqual(t, name+".Spec", inst.Spec, web0.Spec)
				corpusEqual(t, name+".SpecHash", inst.SpecHash, web0.SpecHash)
				corpusEqual(t, name+".VIP", inst.VIP, svc.VIP)
				corpusEqual(t, name+".NodeSelector", inst.NodeSelector, map[string]string{"disk": "ssd"})
			}
			if web0.Surge {
				t.Error("web-0 is a surge instance")
			}
			db := corpusService(t, m, "db")
			corpusEqual(t, "db.Surge", db.Surge, []string(nil))
			corpusEqual(t, "db-0.Pin", corpusInstance(t, m, "db-0").Pin, "n1")
		},
	},
	{
		name: "surge instances fit the instance cap",
		files: map[string]string{
			"cluster.yaml":  corpusBase["cluster.yaml"] + "  maxInstances: 5\n",
			"apps/web.yaml": checksService("  replicas: 3\n  strategy: {maxSurge: 2}\n", ""),
		},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "instances", len(m.Instances), 5)
		},
	},
	{
		name:  "a status written as a YAML integer",
		files: checksWeb(checksReadiness("http: {status: 204}")),
		check: func(t *testing.T, m *render.Model) {
			h := corpusInstance(t, m, "web-0").Spec.Checks.Readiness.HTTP
			corpusEqual(t, "status", [2]int{h.StatusMin, h.StatusMax}, [2]int{204, 204})
		},
	},
}

func TestChecksValid(t *testing.T) {
	t.Parallel()
	runCorpusValid(t, checksValid)
}

// Percentages are resolved against the replicas as Kubernetes does:
// maxUnavailable rounded down, maxSurge rounded up, and when both come to
// 0, maxUnavailable is 1.
func TestStrategyPercentRounding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		replicas       int
		strategy       string
		unavail, surge int
	}{
		{3, "", 1, 0},
		{3, "{maxUnavailable: 50%}", 1, 0},
		{3, "{maxUnavailable: 25%}", 1, 0}, // 0.75 → 0, and no surge → 1
		{10, "{maxUnavailable: 25%}", 2, 0},
		{10, "{maxUnavailable: 100%}", 10, 0},
		{3, "{maxSurge: 25%}", 1, 1}, // 0.75 → 1
		{10, "{maxSurge: 25%, maxUnavailable: 25%}", 2, 3},
		{10, "{maxSurge: 1%, maxUnavailable: 0}", 0, 1},
		{3, "{maxSurge: 0%, maxUnavailable: 1%}", 1, 0}, // both come to 0
		{4, "{maxSurge: 2, maxUnavailable: 0%}", 0, 2},
		{0, "{maxSurge: 2, maxUnavailable: 0}", 1, 0}, // no replicas: no surge
		{2, "{maxSurge: 5}", 1, 5},
	} {
		t.Run(fmt.Sprintf("%d replicas %s", tc.replicas, tc.strategy), func(t *testing.T) {
			t.Parallel()
			spec := fmt.Sprintf("  replicas: %d\n", tc.replicas)
			if tc.strategy != "" {
				spec += "  strategy: " + tc.strategy + "\n"
			}
			m := checksRender(t, map[string]string{"apps/web.yaml": checksService(spec, "")})
			svc := corpusService(t, m, "web")
			got := [2]int{svc.Strategy.MaxUnavailable, svc.Strategy.MaxSurge}
			if want := [2]int{tc.unavail, tc.surge}; got != want {
				t.Errorf("replicas %d, strategy %s: maxUnavailable, maxSurge = %v, want %v", tc.replicas, tc.strategy, got, want)
			}
			corpusEqual(t, "len(Surge)", len(svc.Surge), tc.surge)
			corpusEqual(t, "len(Instances)", len(svc.Instances), tc.replicas)
		})
	}
}

// A change of the checks a spec writes is a restart: it rolls out, paced,
// so that a broken check stops the rollout after one replica rather than
// turning every replica unready at once; it changes the middle part of
// the specHash. terminationGracePeriod is live: the last part only. The
// default readiness check written out changes nothing.
func TestChecksChangeClass(t *testing.T) {
	t.Parallel()
	hashOf := func(template string) (string, render.JailSpec) {
		t.Helper()
		inst := corpusInstance(t, checksRender(t, checksWeb(template)), "web-0")
		return inst.SpecHash, inst.Spec
	}
	baseHash, baseSpec := hashOf("")
	for _, tc := range []struct {
		name, template string
		want           []render.FieldChange // nil: the same hash
	}{
		{"the default readiness check written out", checksReadiness("tcp: {port: 8080}, period: 5s, timeout: 1s, successThreshold: 1, failureThreshold: 3"), nil},
		{"the default grace period written out", "    terminationGracePeriod: 10s\n", nil},
		{"readiness over http", checksReadiness("http: {path: /healthz}"),
			[]render.FieldChange{{Field: "checks", Class: render.ChangeRestart, Detail: "checks: readiness: tcp 8080 (default) → http 8080 /healthz"}}},
		{"a slower default readiness check", checksReadiness("tcp: {}, period: 10s, failureThreshold: 5"),
			[]render.FieldChange{{Field: "checks", Class: render.ChangeRestart, Detail: "checks: readiness: tcp 8080 (default) → tcp 8080, period 5s → 10s, failureThreshold 3 → 5"}}},
		{"a liveness check added", "    checks: {liveness: {exec: {command: [/bin/ok]}}}\n",
			[]render.FieldChange{{Field: "checks", Class: render.ChangeRestart, Detail: "checks: +liveness: exec /bin/ok"}}},
		{"a longer grace period", "    terminationGracePeriod: 1m\n",
			[]render.FieldChange{{Field: "terminationGracePeriod", Class: render.ChangeLive, Detail: "terminationGracePeriod: 10s → 1m0s"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hash, spec := hashOf(tc.template)
			changes := render.CompareSpecs(baseSpec, spec)
			corpusEqual(t, "CompareSpecs", changes, tc.want)
			wantClass := render.ChangeClass("")
			if tc.want != nil {
				wantClass = tc.want[0].Class
			}
			corpusEqual(t, "ClassifyHashChange", render.ClassifyHashChange(baseHash, hash), wantClass)
			if tc.want != nil && hash[:16] != baseHash[:16] {
				t.Errorf("hash %s → %s: the replace part changed", baseHash, hash)
			}
		})
	}
	// The default readiness check follows the Service's port, live.
	def := *baseSpec.Checks.Readiness
	moved := baseSpec
	moved.Checks.Readiness = &render.Check{TCP: &render.TCPCheck{Port: 9090}, Period: def.Period, Timeout: def.Timeout,
		SuccessThreshold: def.SuccessThreshold, FailureThreshold: def.FailureThreshold, Default: true}
	if c := render.ClassifyHashChange(render.SpecHash(baseSpec), render.SpecHash(moved)); c != render.ChangeLive {
		t.Errorf("the default readiness check on another port: a %q change, want live", c)
	}
	// And the other way: a check removed.
	_, withLiveness := hashOf("    checks: {liveness: {tcp: {port: 9}}, startup: {tcp: {}}}\n")
	got := render.CompareSpecs(withLiveness, baseSpec)
	corpusEqual(t, "CompareSpecs", got, []render.FieldChange{{Field: "checks", Class: render.ChangeRestart, Detail: "checks: -startup; -liveness"}})
}
