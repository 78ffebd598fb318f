package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// TestRBACManifest checks deploy/rbac.yaml holds what a user expects to
// apply: the namespace, the ServiceAccount, the role and its binding.
func TestRBACManifest(t *testing.T) {
	c := startCluster(t, 0)
	ctx := context.Background()
	objs, err := cphelper.ApplyFile(ctx, c.admin, rbacManifest(t))
	if err != nil {
		t.Fatalf("apply deploy/rbac.yaml twice: %v", err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, fmt.Sprintf("%T", o))
	}
	want := []string{"*v1.Namespace", "*v1.ServiceAccount", "*v1.ClusterRole", "*v1.ClusterRoleBinding"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("deploy/rbac.yaml objects = %v, want %v", kinds, want)
	}
	if _, err := c.admin.CoreV1().ServiceAccounts("tracer").Get(ctx, "tracer", metav1.GetOptions{}); err != nil {
		t.Fatalf("get ServiceAccount tracer/tracer: %v", err)
	}
	crb, err := c.admin.RbacV1().ClusterRoleBindings().Get(ctx, "tracer", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get ClusterRoleBinding tracer: %v", err)
	}
	wantSubj := rbacv1.Subject{Kind: "ServiceAccount", Name: "tracer", Namespace: "tracer"}
	if len(crb.Subjects) != 1 || crb.Subjects[0] != wantSubj || crb.RoleRef.Name != "tracer" || crb.RoleRef.Kind != "ClusterRole" {
		t.Fatalf("ClusterRoleBinding tracer = subjects %+v role %+v, want only %+v bound to ClusterRole tracer", crb.Subjects, crb.RoleRef, wantSubj)
	}
}

// TestRBACLeastPrivilege: with deploy/rbac.yaml applied, the tracer's
// ServiceAccount may read pods, Services and EndpointSlices and nothing
// else: the API server's own authorizer answers, and real calls agree.
func TestRBACLeastPrivilege(t *testing.T) {
	c := startCluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Objects to read and to try to break, made by the admin.
	ns := "rbac-test"
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	pod := testPod(ns, "web", "node-a")
	if _, err := c.admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := c.admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "creds"}, StringData: map[string]string{"k": "v"}}
	if _, err := c.admin.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create secret: %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "conf"}, Data: map[string]string{"k": "v"}}
	if _, err := c.admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap: %v", err)
	}

	t.Run("access reviews", func(t *testing.T) {
		cases := []struct {
			verb, group, resource, ns string
			allowed                   bool
		}{
			{"list", "", "pods", "", true},
			{"watch", "", "pods", "", true},
			{"get", "", "pods", ns, true},
			{"list", "", "services", "", true},
			{"watch", "", "services", "", true},
			{"get", "", "services", ns, true},
			{"list", "discovery.k8s.io", "endpointslices", "", true},
			{"watch", "discovery.k8s.io", "endpointslices", "", true},
			{"get", "discovery.k8s.io", "endpointslices", ns, true},

			{"get", "", "secrets", ns, false},
			{"list", "", "secrets", "", false},
			{"watch", "", "secrets", "", false},
			{"get", "", "configmaps", ns, false},
			{"list", "", "configmaps", "", false},
			{"create", "", "pods", ns, false},
			{"update", "", "pods", ns, false},
			{"patch", "", "pods/status", ns, false},
			{"delete", "", "pods", ns, false},
			{"create", "", "pods/exec", ns, false},
			{"get", "", "pods/log", ns, false},
			{"create", "", "services", ns, false},
			{"delete", "", "services", ns, false},
			{"update", "", "services", ns, false},
			{"create", "discovery.k8s.io", "endpointslices", ns, false},
			{"delete", "discovery.k8s.io", "endpointslices", ns, false},
			{"list", "", "endpoints", "", false},
			{"list", "", "nodes", "", false},
			{"list", "", "namespaces", "", false},
			{"create", "", "serviceaccounts/token", "tracer", false},
			{"bind", "rbac.authorization.k8s.io", "clusterroles", "", false},
			{"escalate", "rbac.authorization.k8s.io", "clusterroles", "", false},
			{"impersonate", "", "users", "", false},
		}
		for _, tc := range cases {
			got := accessReview(ctx, t, c.tracer, tc.verb, tc.group, tc.resource, tc.ns)
			if got.Allowed != tc.allowed {
				t.Errorf("tracer may %s %s.%s in %q: allowed=%v, want %v (%s)", tc.verb, tc.resource, tc.group, tc.ns, got.Allowed, tc.allowed, got.Reason)
			}
		}
	})

	t.Run("rules review", func(t *testing.T) {
		// Every resource rule the tracer holds in a namespace is
		// read-only, apart from the self-reviews every authenticated user
		// may create (system:basic-user).
		rules := rulesOf(ctx, t, c.tracer, ns)
		for _, r := range rules {
			selfReview := slices.Equal(r.Verbs, []string{"create"}) && allIn(r.APIGroups, "authorization.k8s.io", "authentication.k8s.io") &&
				allIn(r.Resources, "selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews")
			if !selfReview && !allIn(r.Verbs, "get", "list", "watch") {
				t.Errorf("tracer rule %+v grants more than get/list/watch", r)
			}
		}
		// What deploy/rbac.yaml adds to what any other ServiceAccount of
		// namespace tracer may do (the cluster's defaults for
		// authenticated users and ServiceAccounts) is exactly the
		// informers' reads.
		impersonated := c.cp.AdminConfig()
		impersonated.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:tracer:other",
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:tracer", "system:authenticated"},
		}
		plain, err := kubernetes.NewForConfig(impersonated)
		if err != nil {
			t.Fatalf("impersonating client: %v", err)
		}
		baseline := map[string]bool{}
		for _, g := range grants(rulesOf(ctx, t, plain, ns)) {
			baseline[g] = true
		}
		var added []string
		for _, g := range grants(rules) {
			if !baseline[g] {
				added = append(added, g)
			}
		}
		slices.Sort(added)
		want := []string{
			"discovery.k8s.io/endpointslices get", "discovery.k8s.io/endpointslices list", "discovery.k8s.io/endpointslices watch",
			"pods get", "pods list", "pods watch",
			"services get", "services list", "services watch",
		}
		if !slices.Equal(added, want) {
			t.Errorf("deploy/rbac.yaml grants %q beyond another ServiceAccount's, want exactly %q", added, want)
		}
	})

	t.Run("real calls", func(t *testing.T) {
		allowed := []struct {
			what string
			call func() error
		}{
			{"list pods", func() error { _, err := c.tracer.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err }},
			{"get pod", func() error { _, err := c.tracer.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{}); return err }},
			{"watch pods", func() error { return watchOnce(c.tracer.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{})) }},
			{"list services", func() error { _, err := c.tracer.CoreV1().Services("").List(ctx, metav1.ListOptions{}); return err }},
			{"watch services", func() error { return watchOnce(c.tracer.CoreV1().Services("").Watch(ctx, metav1.ListOptions{})) }},
			{"list endpointslices", func() error {
				_, err := c.tracer.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
				return err
			}},
			{"watch endpointslices", func() error {
				return watchOnce(c.tracer.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{}))
			}},
		}
		for _, a := range allowed {
			if err := a.call(); err != nil {
				t.Errorf("tracer %s: %v, want allowed", a.what, err)
			}
		}
		denied := []struct {
			what string
			call func() error
		}{
			{"get secret", func() error {
				_, err := c.tracer.CoreV1().Secrets(ns).Get(ctx, "creds", metav1.GetOptions{})
				return err
			}},
			{"list secrets", func() error { _, err := c.tracer.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err }},
			{"get configmap", func() error {
				_, err := c.tracer.CoreV1().ConfigMaps(ns).Get(ctx, "conf", metav1.GetOptions{})
				return err
			}},
			{"list configmaps", func() error { _, err := c.tracer.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{}); return err }},
			{"create pod", func() error {
				_, err := c.tracer.CoreV1().Pods(ns).Create(ctx, testPod(ns, "evil", "node-a"), metav1.CreateOptions{})
				return err
			}},
			{"delete pod", func() error { return c.tracer.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{}) }},
			{"delete service", func() error { return c.tracer.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}) }},
			{"create endpointslice", func() error {
				es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "evil"}, AddressType: discoveryv1.AddressTypeIPv4}
				_, err := c.tracer.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
				return err
			}},
			{"list nodes", func() error { _, err := c.tracer.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err }},
		}
		for _, d := range denied {
			err := d.call()
			if !apierrors.IsForbidden(err) {
				t.Errorf("tracer %s: err = %v, want Forbidden", d.what, err)
			}
		}
		// The denied writes changed nothing.
		if _, err := c.admin.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{}); err != nil {
			t.Errorf("service web after the tracer's denied delete: %v", err)
		}
		if _, err := c.admin.CoreV1().Pods(ns).Get(ctx, "evil", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("pod evil after the tracer's denied create: err = %v, want NotFound", err)
		}
	})
}

// rulesOf is cs's user's resource rules in ns, from the API server's
// SelfSubjectRulesReview.
func rulesOf(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) []authorizationv1.ResourceRule {
	t.Helper()
	ssrr := &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns}}
	got, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, ssrr, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectRulesReview: %v", err)
	}
	if got.Status.Incomplete {
		t.Fatalf("SelfSubjectRulesReview incomplete: %s", got.Status.EvaluationError)
	}
	return got.Status.ResourceRules
}

// grants expands rules into "group/resource verb" strings (core resources
// without a group); a wildcard stays a "*".
func grants(rules []authorizationv1.ResourceRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					name := res
					if g != "" {
						name = g + "/" + res
					}
					if len(r.ResourceNames) > 0 {
						name += "[" + strings.Join(r.ResourceNames, ",") + "]"
					}
					out = append(out, name+" "+v)
				}
			}
		}
	}
	return out
}

func allIn(xs []string, allowed ...string) bool {
	for _, x := range xs {
		if !slices.Contains(allowed, x) {
			return false
		}
	}
	return len(xs) > 0
}

// watchOnce checks a watch was established, then stops it.
func watchOnce(w interface{ Stop() }, err error) error {
	if err != nil {
		return err
	}
	w.Stop()
	return nil
}

// testPod is a minimal pod bound to node (no scheduler runs).
func testPod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/app:1"}},
		},
	}
}

// accessReview asks the API server's authorizer whether cs's user may verb
// resource ("pods", or "pods/portforward" for a subresource) of group in
// namespace ns.
func accessReview(ctx context.Context, t *testing.T, cs kubernetes.Interface, verb, group, resource, ns string) authorizationv1.SubjectAccessReviewStatus {
	t.Helper()
	res, sub, _ := strings.Cut(resource, "/")
	ssar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: res, Subresource: sub},
	}}
	got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, ssar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectAccessReview %s %s: %v", verb, resource, err)
	}
	return got.Status
}
