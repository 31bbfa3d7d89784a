package ociimage

import "testing"

func TestSplitName(t *testing.T) {
	for _, tc := range []struct{ name, host, repo, tag string }{
		{"127.0.0.1:5000/e2e-test-images/agnhost:2.66.1", "127.0.0.1:5000", "e2e-test-images/agnhost", "2.66.1"},
		{"127.0.0.1:5000/pause:3.10.2", "127.0.0.1:5000", "pause", "3.10.2"},
		{"registry.example/a/b/c:v1", "registry.example", "a/b/c", "v1"},
	} {
		host, repo, tag, err := splitName(tc.name)
		if err != nil || host != tc.host || repo != tc.repo || tag != tc.tag {
			t.Errorf("splitName(%q) = %q, %q, %q, %v; want %q, %q, %q", tc.name, host, repo, tag, err, tc.host, tc.repo, tc.tag)
		}
	}
	for _, bad := range []string{"busybox:1", "127.0.0.1:5000/busybox", "127.0.0.1:5000/a:b/c"} {
		if _, _, _, err := splitName(bad); err == nil {
			t.Errorf("splitName(%q) accepted a name without host or tag", bad)
		}
	}
}
