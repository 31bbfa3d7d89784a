package sdk

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// The hand-written decoder reads what encoding/json reads into the same
// types.
func TestDecodeMatchesEncodingJSON(t *testing.T) {
	pod2KB, err := os.ReadFile("testdata/admission-2kb.json")
	if err != nil {
		t.Fatal(err)
	}
	inputs := []string{
		string(pod2KB),
		`{}`,
		`{"pod":null,"node":null,"settings":null}`,
		`{"pod":{},"node":{"name":"n"},"settings":{}}`,
		` {"pod" : {"metadata":{"name":"a\"b\\c\u00e9\ud83d\ude00\n","labels":{},"annotations":null}} , "extra":[1,2.5e3,{"x":[true,false,null]}]} `,
		`{"POD":{"Spec":{"HOSTNETWORK":true,"containers":[{"name":"c","ports":[{"containerPort":80}],"securityContext":{"privileged":true,"runAsUser":-3,"capabilities":{"add":["NET_ADMIN"],"drop":[]}}}],"volumes":[{"name":"v","hostPath":{"path":"/etc","type":""}},{"name":"e","emptyDir":{}}]}}}`,
		`{"pod":{"spec":{"containers":[],"initContainers":null,"securityContext":{"runAsNonRoot":false}}},"settings":[1,"x"]}`,
		`{"pod":{"metadata":{"name":"first","name":"second"}}}`,
		`{"pod":{"metadata":{"labels":{"a\u0041":"b\/c"}}}}`,
	}
	for _, in := range inputs {
		got, err := DecodeAdmissionRequest([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		var want AdmissionRequest
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("encoding/json: %s: %v", in, err)
		}
		want.input = []byte(in)
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("%s:\n got %+v\nwant %+v", in, *got, want)
		}
	}
	probe := `{"pod":{"spec":{"containers":[{"name":"collector"}]}},"container":"collector","podIP":"10.0.0.1","ports":[8080,9090],"settings":{"port":8080}}`
	got, err := DecodeProbeRequest([]byte(probe))
	if err != nil {
		t.Fatal(err)
	}
	var want ProbeRequest
	if err := json.Unmarshal([]byte(probe), &want); err != nil {
		t.Fatal(err)
	}
	want.input = []byte(probe)
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("probe:\n got %+v\nwant %+v", *got, want)
	}
	raw, err := got.RawPod()
	if err != nil || string(raw) != `{"spec":{"containers":[{"name":"collector"}]}}` {
		t.Errorf("RawPod = %s, %v", raw, err)
	}
}

// What encoding/json refuses, the decoder refuses.
func TestDecodeRefusesMalformed(t *testing.T) {
	for _, in := range []string{
		``, `[]`, `{`, `{"pod":}`, `{"pod":{"metadata":{"name":1}}}`, `{"pod":{"spec":{"hostNetwork":"yes"}}}`,
		`{"pod":{"spec":{"containers":[{"ports":[{"containerPort":1.5}]}]}}}`, `{"pod":{}} x`, `{"a":"unterminated}`,
		`{"a":tru}`, `{"a":[1,]}`, `{"a":"bad \q escape"}`, `{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`,
	} {
		if _, err := DecodeAdmissionRequest([]byte(in)); err == nil {
			t.Errorf("%.60s: no error", in)
		}
	}
}

func TestValidNumber(t *testing.T) {
	for _, n := range []string{"0", "-0", "12", "-12.5", "1e9", "1E+9", "2.5e-3", "0.0", "1", "-", "01", "1.", ".5", "1e", "1e+", "+1", "--1", "1.5.5", "0x1", "1-2"} {
		if got, want := validNumber([]byte(n)), json.Valid([]byte(n)); got != want {
			t.Errorf("validNumber(%q) = %v, encoding/json says %v", n, got, want)
		}
	}
}
