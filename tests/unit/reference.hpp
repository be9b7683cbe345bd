// Test helpers: seeded random data, closeness with a stated tolerance, and
// central finite differences. Independent of the code under test: nothing
// here calls a kernel.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace mpiformer::test {

inline std::vector<double> random_vector(size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// |got - want| <= abs + rel * |want| element by element (llm.c's form).
template <class A, class B>
::testing::AssertionResult all_close(const A& got, const B& want, double abs, double rel) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double err = std::fabs(g - w);
    if (!(err <= abs + rel * std::fabs(w))) {
      if (bad++ == 0) first = i;
      worst = std::max(worst, err);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; first at " << first << ": got "
         << static_cast<double>(got[first]) << ", want " << static_cast<double>(want[first])
         << "; worst |error| " << worst;
}

// d loss / d x[i] by central differences, for every i.
// all_close with an absolute tolerance of `fraction` of want's largest
// magnitude: for results whose elements near zero carry the large ones'
// rounding (sums of products of many terms).
template <class A, class B>
::testing::AssertionResult close_to_largest(const A& got, const B& want, double fraction) {
  double largest = 0;
  for (const auto& w : want) largest = std::max(largest, std::fabs(static_cast<double>(w)));
  return all_close(got, want, fraction * largest, 0.0);
}

inline std::vector<double> finite_difference(std::vector<double>& x,
                                             const std::function<double()>& loss, double h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace mpiformer::test
