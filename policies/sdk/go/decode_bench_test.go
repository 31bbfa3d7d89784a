package sdk

import (
	"encoding/json"
	"os"
	"testing"
)

func BenchmarkDecodeAdmissionRequest(b *testing.B) {
	in, err := os.ReadFile("testdata/admission-2kb.json")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeAdmissionRequest(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSettings(b *testing.B) {
	raw := json.RawMessage(`{"registries":["registry.local:5000","docker.io/library"]}`)
	var s struct {
		Registries []string `json:"registries"`
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeSettings(raw, &s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshalResponse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(AdmissionResponse{Allowed: true}); err != nil {
			b.Fatal(err)
		}
	}
}
