//! Small statistics shared by the benches that run several rounds.

/// The smallest, median (the middle value; the mean of the two middle values for an
/// even count) and largest of `values`; `None` when there are none.
pub fn min_median_max(mut values: Vec<f64>) -> Option<(f64, f64, f64)> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let k = values.len();
    let median = if k % 2 == 1 {
        values[k / 2]
    } else {
        (values[k / 2 - 1] + values[k / 2]) / 2.0
    };
    Some((values[0], median, values[k - 1]))
}

/// The list that follows a bench's table when it ran several rounds: one line per
/// label with its ratio's smallest, median and largest value; empty for one round
/// or no labels.
pub fn spread_list(
    rounds: usize,
    items: impl IntoIterator<Item = (String, f64, f64, f64)>,
) -> String {
    let body: String = items
        .into_iter()
        .map(|(label, min, median, max)| format!("- {label}: {min:.2} / {median:.2} / {max:.2}\n"))
        .collect();
    if rounds <= 1 || body.is_empty() {
        return String::new();
    }
    format!("\nhuddle ÷ baseline over {rounds} rounds (min / median / max):\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_and_middle_of_odd_even_and_no_values() {
        assert_eq!(min_median_max(vec![]), None);
        assert_eq!(min_median_max(vec![0.5]), Some((0.5, 0.5, 0.5)));
        assert_eq!(min_median_max(vec![0.9, 0.1, 0.5]), Some((0.1, 0.5, 0.9)));
        assert_eq!(
            min_median_max(vec![0.8, 0.2, 0.6, 0.4]),
            Some((0.2, 0.5, 0.8))
        );
    }

    #[test]
    fn the_spread_list_follows_only_several_rounds() {
        let item = || vec![("append, batch 100".to_string(), 0.8, 0.85, 0.9)];
        assert_eq!(spread_list(1, item()), "");
        assert_eq!(spread_list(3, Vec::new()), "");
        assert_eq!(
            spread_list(3, item()),
            "\nhuddle ÷ baseline over 3 rounds (min / median / max):\n\
             - append, batch 100: 0.80 / 0.85 / 0.90\n"
        );
    }
}
