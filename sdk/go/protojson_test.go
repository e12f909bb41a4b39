package driver

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParamsAreReadAsProto3JSONHasThem(t *testing.T) {
	cases := []struct {
		name, in string
		want     string // the message re-encoded, or "error: <part of the error>"
	}{
		{"proto names", `{"available":["a","b"],"must_include":["b"],"size":1}`, `{"available":["a","b"],"must_include":["b"],"size":1}`},
		{"lowerCamelCase names", `{"mustInclude":["b"],"size":2}`, `{"must_include":["b"],"size":2}`},
		{"an int32 as a string", `{"size":"3"}`, `{"size":3}`},
		{"an integral float", `{"size":3.0}`, `{"size":3}`},
		{"null is the default", `{"available":null,"size":null}`, `{}`},
		{"an unknown field", `{"colour":"blue"}`, `error: has no field "colour"`},
		{"out of int32's range", `{"size":4294967296}`, `error: out of range`},
		{"a fraction", `{"size":1.5}`, `error: expected an integer`},
		{"a bool for an int", `{"size":true}`, `error: expected an integer`},
		{"a number for a string", `{"available":[1]}`, `error: expected a string`},
		{"null inside a list", `{"available":[null]}`, `error: item 0 is null`},
		{"not an object", `[1]`, `error: must be an object`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got PreferenceRequest
			err := json.Unmarshal([]byte(c.in), &got)
			if want, ok := strings.CutPrefix(c.want, "error: "); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("want an error containing %q, got %v (%+v)", want, err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out, _ := json.Marshal(&got)
			if string(out) != c.want {
				t.Fatalf("got %s, want %s", out, c.want)
			}
		})
	}
}

func TestDevicesAreWrittenInTheProto3JSONMapping(t *testing.T) {
	n, version := int64(-7), "1.0.0"
	device := Device{ID: "d0", Health: Unhealthy, Grant: &Grant{}, Attributes: map[string]Attribute{
		"n": {Int: &n}, "v": {Version: &version},
	}}
	out, err := json.Marshal(&device)
	if err != nil {
		t.Fatal(err)
	}
	// Enums by name, an int64 as a string, an optional message present (even empty) when set.
	want := `{"id":"d0","health":"UNHEALTHY","grant":{},"attributes":{"n":{"int":"-7"},"v":{"version":"1.0.0"}}}`
	if string(out) != want {
		t.Fatalf("got %s, want %s", out, want)
	}
	var back Device
	if err := json.Unmarshal(out, &back); err != nil || *back.Attributes["n"].Int != -7 || back.Grant == nil {
		t.Fatalf("read back %+v, %v", back, err)
	}
	if Health(7).String() != "7" || Healthy.String() != "HEALTHY" {
		t.Fatalf("enum names: %s %s", Health(7), Healthy)
	}
}

func TestProtocolVersionRule(t *testing.T) {
	for version, code := range map[string]int{
		"1.0.0": 0, "1.99.3-rc.1+build": 0, "2.0.0": CodeInvalidRequest, "1.2": CodeInvalidParams,
		"1.٣.0": CodeInvalidParams, "01.2.0": CodeInvalidParams, "": CodeInvalidParams,
	} {
		err := checkProtocolVersion(version)
		got := 0
		if err != nil {
			got = asError(err).Code
		}
		if got != code {
			t.Errorf("%q: got code %d, want %d (%v)", version, got, code, err)
		}
	}
}
