package cri

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCgroupDriverVerdict: the runtime's reported driver against the agent's: a match passes,
// a mismatch fails saying what to set, a runtime without RuntimeConfig passes with a note.
func TestCgroupDriverVerdict(t *testing.T) {
	reports := func(d criapi.CgroupDriver) *criapi.RuntimeConfigResponse {
		return &criapi.RuntimeConfigResponse{Linux: &criapi.LinuxRuntimeConfiguration{CgroupDriver: d}}
	}
	for _, tt := range []struct {
		name     string
		resp     *criapi.RuntimeConfigResponse
		err      error
		want     string
		wantErr  string
		wantNote bool
	}{
		{"systemd both", reports(criapi.CgroupDriver_SYSTEMD), nil, "systemd", "", false},
		{"cgroupfs both", reports(criapi.CgroupDriver_CGROUPFS), nil, "cgroupfs", "", false},
		{"runtime systemd", reports(criapi.CgroupDriver_SYSTEMD), nil, "cgroupfs", "set cgroupDriver: systemd", false},
		{"runtime cgroupfs", reports(criapi.CgroupDriver_CGROUPFS), nil, "systemd", "SystemdCgroup = false", false},
		{"no RuntimeConfig", nil, status.Error(codes.Unimplemented, "unknown method RuntimeConfig"), "systemd", "", true},
		{"no linux", &criapi.RuntimeConfigResponse{}, nil, "systemd", "", true},
		{"runtime down", nil, status.Error(codes.Unavailable, "connection refused"), "systemd", "RuntimeConfig", false},
		{"unknown driver", reports(criapi.CgroupDriver(7)), nil, "systemd", "unknown cgroup driver 7", false},
		{"not a status", nil, errors.New("boom"), "systemd", "boom", false},
	} {
		note, err := cgroupDriverVerdict(tt.resp, tt.err, tt.want)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: error %v, want one saying %q", tt.name, err, tt.wantErr)
		}
		if (note != "") != tt.wantNote {
			t.Errorf("%s: note %q, want one: %v", tt.name, note, tt.wantNote)
		}
	}
}
